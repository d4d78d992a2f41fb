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

use std::time::{Duration, Instant};

use minfer_tokenizer::Tokenizer;

use crate::engine::{Engine, EngineError};
use crate::multi::{MultiEngine, SeqStep};
use crate::sampling::{Sampler, SamplingParams};

/// Largest draft length `--draft-max` accepts.
pub const DRAFT_MAX_LIMIT: usize = 16;

/// The default draft length cap: verify blocks of up to 8 tokens.
pub const DEFAULT_DRAFT_MAX: usize = 7;

/// Longest n-gram the lookup matches.
pub const NGRAM_MAX: usize = 4;

/// Shortest n-gram the lookup matches.
pub const NGRAM_MIN: usize = 1;

/// The draft depths used with a cap of `max` (0, plain decode, is always allowed too):
/// verify widths of 2, 4, 8 and 16 tokens, the widths the quantized matmul kernels take
/// in whole passes of four, plus `max` itself.
pub fn depth_set(max: usize) -> Vec<usize> {
    let mut v: Vec<usize> = [1, 3, 7, 15].into_iter().filter(|&d| d <= max).collect();
    if max > 0 && !v.contains(&max) {
        v.push(max);
    }
    v
}

/// Checks a draft length cap, naming the flag.
pub fn check_draft_max(max: usize) -> Result<(), EngineError> {
    if max == 0 || max > DRAFT_MAX_LIMIT {
        return Err(EngineError::Param {
            name: "--draft-max",
            message: format!("{max} is not in 1..={DRAFT_MAX_LIMIT}"),
        });
    }
    Ok(())
}

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
    /// [`Speculator::step`]).
    fn weight_bytes(&self) -> Option<u64> {
        None
    }
}

/// The bytes of weights in `file`: what one decode step streams, on a machine where
/// decode is bound by reading them.
fn file_weight_bytes(file: &minfer_gguf::GgufFile) -> u64 {
    file.tensors().iter().map(|t| t.n_bytes).sum()
}

/// Refuses a draft whose vocabulary differs from the target's, naming the first
/// difference: the size, a token's bytes, or a special id.
pub fn check_same_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), EngineError> {
    let bad = |message: String| {
        Err(EngineError::Param {
            name: "draft model",
            message,
        })
    };
    if target.n_vocab() != draft.n_vocab() {
        return bad(format!(
            "its vocabulary has {} tokens and the target's {}: the draft must share the target's vocabulary",
            draft.n_vocab(),
            target.n_vocab()
        ));
    }
    for id in 0..target.n_vocab() as u32 {
        let (a, b) = (target.token_bytes(id, true), draft.token_bytes(id, true));
        if a.as_deref().ok() != b.as_deref().ok() {
            return bad(format!(
                "token {id} is {:?} in the target and {:?} in the draft: the vocabularies differ",
                a.map(String::from_utf8_lossy).unwrap_or_default(),
                b.map(String::from_utf8_lossy).unwrap_or_default()
            ));
        }
    }
    let specials = [
        ("bos", target.bos(), draft.bos()),
        ("eos", target.eos(), draft.eos()),
    ];
    for (what, a, b) in specials {
        if a != b {
            return bad(format!(
                "its {what} token is {b:?} and the target's {a:?}: the vocabularies differ"
            ));
        }
    }
    if target.eog_ids() != draft.eog_ids() {
        return bad(format!(
            "its end-of-generation tokens are {:?} and the target's {:?}: the vocabularies differ",
            draft.eog_ids(),
            target.eog_ids()
        ));
    }
    Ok(())
}

/// A second, smaller model with the target's vocabulary: its own engine (backends,
/// weight registry and `GraphCache`), its own KV, following the target's tokens.
pub struct DraftModel {
    engine: Engine,
    /// Where the draft's view of the context starts: a new context runs whole, but a
    /// draft that fell far behind on a context it shares (the depth chose plain decode
    /// for a while) restarts from its last [`DRAFT_WINDOW`] tokens instead of catching
    /// up on all of them.
    base: usize,
    /// The tokens whose KV rows the draft engine holds, at positions `0..len`: the
    /// context from `base` on.
    kv: Vec<u32>,
    /// The draft's own sampler: the target's parameters, a separate random stream.
    sampler: Option<Sampler>,
    logits: Vec<f32>,
}

impl DraftModel {
    /// A draft over `engine`, refused unless its vocabulary is the target's (`target`
    /// is the target's tokenizer) and its context is at least `n_ctx`.
    pub fn new(engine: Engine, target: &Tokenizer, n_ctx: usize) -> Result<Self, EngineError> {
        let tok = Tokenizer::from_gguf(engine.file()).map_err(|e| EngineError::Param {
            name: "draft model",
            message: format!("its tokenizer: {e}"),
        })?;
        check_same_vocab(target, &tok)?;
        if engine.n_vocab() != target.n_vocab() {
            return Err(EngineError::Param {
                name: "draft model",
                message: format!(
                    "its logits rows have {} entries and the vocabulary {}",
                    engine.n_vocab(),
                    target.n_vocab()
                ),
            });
        }
        if engine.n_ctx() < n_ctx {
            return Err(EngineError::Param {
                name: "draft model",
                message: format!(
                    "its context holds {} tokens, the target's {n_ctx}",
                    engine.n_ctx()
                ),
            });
        }
        Ok(DraftModel {
            engine,
            base: 0,
            kv: Vec::new(),
            sampler: None,
            logits: Vec::new(),
        })
    }

    /// The draft's engine.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }
}

/// Most tokens a draft model catches up on in one proposal; further behind, it restarts
/// from the last [`DRAFT_WINDOW`] tokens of the context.
pub const DRAFT_CATCHUP_MAX: usize = 64;

/// The context a draft model restarts from: enough for local predictions, cheap to run.
pub const DRAFT_WINDOW: usize = 32;

/// Seed offset of a draft model's random stream, so that it never replays the target's.
const DRAFT_SEED_MIX: u64 = 0xD1B5_4A32_D192_ED03;

impl DraftSource for DraftModel {
    fn name(&self) -> &'static str {
        "draft model"
    }

    fn runs_model(&self) -> bool {
        true
    }

    fn weight_bytes(&self) -> Option<u64> {
        Some(file_weight_bytes(self.engine.file()))
    }

    fn propose(
        &mut self,
        context: &[u32],
        max: usize,
        target: &Sampler,
        out: &mut Draft,
    ) -> Result<(), EngineError> {
        out.tokens.clear();
        out.probs.clear();
        out.class = 0;
        let room = self.engine.n_ctx().saturating_sub(context.len());
        let max = max.min(room);
        if max == 0 || context.is_empty() {
            return Ok(());
        }
        let sampler = match &mut self.sampler {
            Some(s) if s.params() == target.params() => s,
            // A fresh chain of the target's parameters, never its grammar: the stream is
            // reseeded and the penalty window copied below.
            slot => slot.insert(Sampler::new(target.params().clone()).map_err(|e| {
                EngineError::Param {
                    name: "sampling",
                    message: e.to_string(),
                }
            })?),
        };
        // The draft's stream is a function of the seed and the position alone, so a
        // fixed seed gives the same drafts (and output) however generations interleave.
        sampler.reseed(
            target.params().seed
                ^ DRAFT_SEED_MIX
                ^ (context.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        sampler.copy_window_from(target);
        // The rows the draft holds for the context's prefix stay; at least the last token
        // runs again, for its logits. One forward catches up; far behind, the draft
        // restarts on the context's tail (its predictions are local anyway).
        let view = context.get(self.base..).unwrap_or_default();
        let mut keep = crate::history::common_prefix(&self.kv, view)
            .min(view.len().saturating_sub(1))
            .min(self.engine.seq_len());
        if keep == 0 {
            // A new context (nothing in common): the whole of it, as the target saw it.
            self.base = 0;
        } else if view.len() - keep > DRAFT_CATCHUP_MAX {
            self.base = context.len().saturating_sub(DRAFT_WINDOW);
            keep = 0;
        }
        let view = &context[self.base..];
        self.kv.truncate(keep);
        self.logits = self.engine.prefill(&view[keep..], keep)?;
        self.kv.extend_from_slice(&view[keep..]);
        let greedy = sampler.params().is_greedy();
        for i in 0..max {
            let x = if greedy {
                sampler.sample(&mut self.logits)
            } else {
                let q = sampler.distribution(&mut self.logits);
                let x = sampler.draw(&q);
                out.probs.push(q);
                x
            };
            sampler.accept(x);
            out.tokens.push(x);
            if i + 1 < max {
                let pos = self.kv.len();
                self.engine.forward_into(&[x], pos, 1, &mut self.logits)?;
                self.kv.push(x);
            }
        }
        Ok(())
    }
}

/// A draft model serving several sequences at once (a server's slots): one draft
/// [`MultiEngine`] with a slot per target slot, so the draft steps of every slot that
/// drafts in a turn run together in one draft forward, as their verify blocks run
/// together in the target's.
///
/// Each slot remembers the tokens its draft KV rows hold and compares them with the
/// target's context at every proposal: a new request, a reused prompt prefix, a restored
/// or shifted context all come down to keeping the common prefix and running the rest,
/// so the draft's KV can never disagree with the target's tokens.
///
/// It drafts greedily (the argmax of the draft's logits under the target's penalties and
/// biases) and its drafts carry no distribution, so they are verified by sampling each
/// row from the target and accepting a drafted token equal to the sample: the output is
/// then exactly what plain decode gives for the same seed, however the depth (which
/// follows the load and the timings) varied along the way.
pub struct MultiDraft {
    engine: MultiEngine,
    seqs: Vec<DraftSeq>,
}

/// What one slot of a [`MultiDraft`] holds.
#[derive(Default)]
struct DraftSeq {
    /// Where the slot's view of the context starts (see [`DraftModel`]'s `base`).
    base: usize,
    /// The tokens whose KV rows the slot holds, at positions `0..kv.len()`.
    kv: Vec<u32>,
    /// The greedy drafting chain (the target's penalties and biases).
    sampler: Option<Sampler>,
}

/// One sequence's request to a [`MultiDraft`]: draft up to `max` tokens after `context`.
pub struct DraftAsk<'a> {
    /// The slot (the target's slot index).
    pub slot: usize,
    /// Every token so far, the pending one included.
    pub context: &'a [u32],
    /// Most tokens to draft.
    pub max: usize,
    /// The target's sampler: its penalties and window shape the drafts.
    pub target: &'a Sampler,
}

impl MultiDraft {
    /// A draft over `engine`, refused unless its vocabulary is the target's (`target` is
    /// the target's tokenizer), it has `n_slots` slots and each holds `slot_ctx` positions.
    pub fn new(
        engine: MultiEngine,
        target: &Tokenizer,
        n_slots: usize,
        slot_ctx: usize,
    ) -> Result<Self, EngineError> {
        let tok = Tokenizer::from_gguf(engine.file()).map_err(|e| EngineError::Param {
            name: "draft model",
            message: format!("its tokenizer: {e}"),
        })?;
        check_same_vocab(target, &tok)?;
        let bad = |message: String| {
            Err(EngineError::Param {
                name: "draft model",
                message,
            })
        };
        if engine.n_vocab() != target.n_vocab() {
            return bad(format!(
                "its logits rows have {} entries and the vocabulary {}",
                engine.n_vocab(),
                target.n_vocab()
            ));
        }
        if engine.n_slots() != n_slots {
            return bad(format!(
                "it has {} slots and the target {n_slots}",
                engine.n_slots()
            ));
        }
        if engine.slot_ctx() < slot_ctx {
            return bad(format!(
                "its slots hold {} positions, the target's {slot_ctx}",
                engine.slot_ctx()
            ));
        }
        let seqs = (0..n_slots).map(|_| DraftSeq::default()).collect();
        Ok(MultiDraft { engine, seqs })
    }

    /// The draft's engine.
    pub fn engine(&self) -> &MultiEngine {
        &self.engine
    }

    /// Forgets what `slot` holds (its next proposal runs its whole context): for a slot
    /// whose draft state is suspect, after a panic inside a proposal.
    pub fn forget(&mut self, slot: usize) {
        if let Some(s) = self.seqs.get_mut(slot) {
            s.kv.clear();
            s.base = 0;
        }
        let _ = self.engine.reset_slot(slot);
    }

    /// Drafts for every ask together, into `out` (one block per ask, in order): one draft
    /// forward catches every slot up on its context, then one forward per drafted token
    /// runs every slot still drafting. On an error the asking slots forget their draft KV
    /// (the next proposal runs their context again).
    pub fn propose(
        &mut self,
        asks: &[DraftAsk<'_>],
        out: &mut Vec<Vec<u32>>,
    ) -> Result<(), EngineError> {
        out.clear();
        out.resize_with(asks.len(), Vec::new);
        let r = self.propose_inner(asks, out);
        if r.is_err() {
            for a in asks {
                self.forget(a.slot);
            }
            out.iter_mut().for_each(Vec::clear);
        }
        r
    }

    fn propose_inner(
        &mut self,
        asks: &[DraftAsk<'_>],
        out: &mut [Vec<u32>],
    ) -> Result<(), EngineError> {
        let ctx = self.engine.slot_ctx();
        let mut max = Vec::with_capacity(asks.len());
        let mut steps = Vec::new();
        // Entry of `steps` -> ask index.
        let mut who = Vec::new();
        for (i, a) in asks.iter().enumerate() {
            let n = self.seqs.len();
            let seq = self
                .seqs
                .get_mut(a.slot)
                .ok_or_else(|| EngineError::Param {
                    name: "slot",
                    message: format!("{} is not in 0..{n}", a.slot),
                })?;
            let m = a.max.min(ctx.saturating_sub(a.context.len()));
            max.push(m);
            if m == 0 || a.context.is_empty() {
                continue;
            }
            let params = SamplingParams {
                temperature: 0.0,
                ..a.target.params().clone()
            };
            let sampler = match &mut seq.sampler {
                Some(s) if s.params() == &params => s,
                slot => slot.insert(Sampler::new(params).map_err(|e| EngineError::Param {
                    name: "sampling",
                    message: e.to_string(),
                })?),
            };
            sampler.copy_window_from(a.target);
            // As `DraftModel::propose`: keep the common prefix (but rerun the last token,
            // for its logits); far behind, restart on the context's tail.
            let view = a.context.get(seq.base..).unwrap_or_default();
            let mut keep = crate::history::common_prefix(&seq.kv, view)
                .min(view.len().saturating_sub(1))
                .min(self.engine.slot_len(a.slot)?);
            if keep == 0 {
                seq.base = 0;
            } else if view.len() - keep > DRAFT_CATCHUP_MAX {
                seq.base = a.context.len().saturating_sub(DRAFT_WINDOW);
                keep = 0;
            }
            let view = &a.context[seq.base..];
            seq.kv.truncate(keep);
            seq.kv.extend_from_slice(&view[keep..]);
            steps.push(SeqStep {
                slot: a.slot,
                tokens: view[keep..].to_vec(),
                pos0: keep,
                n_out: 1,
            });
            who.push(i);
        }
        let mut round = 0;
        while !steps.is_empty() {
            let rows = self.engine.step(&steps)?;
            let mut next = Vec::with_capacity(steps.len());
            let mut next_who = Vec::with_capacity(steps.len());
            for (mut row, &i) in rows.into_iter().zip(&who) {
                let a = &asks[i];
                let seq = &mut self.seqs[a.slot];
                let Some(sampler) = seq.sampler.as_mut() else {
                    continue;
                };
                let x = sampler.sample(&mut row);
                sampler.accept(x);
                out[i].push(x);
                if round + 1 < max[i] {
                    next.push(SeqStep {
                        slot: a.slot,
                        tokens: vec![x],
                        pos0: seq.kv.len(),
                        n_out: 1,
                    });
                    seq.kv.push(x);
                    next_who.push(i);
                }
            }
            steps = next;
            who = next_who;
            round += 1;
        }
        Ok(())
    }
}

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
        out.tokens.clear();
        out.probs.clear();
        out.class = 0;
        if let Some((n, cont)) = Self::lookup(context, max) {
            out.tokens.extend_from_slice(cont);
            out.class = n;
        }
        Ok(())
    }
}

/// The source of a [`Speculator`] whose drafts come from outside it (a draft model
/// shared by several sequences, [`MultiDraft`]): proposing here drafts nothing.
struct SharedDraft;

impl DraftSource for SharedDraft {
    fn name(&self) -> &'static str {
        "draft model"
    }

    fn runs_model(&self) -> bool {
        true
    }

    fn propose(
        &mut self,
        _context: &[u32],
        _max: usize,
        _target: &Sampler,
        out: &mut Draft,
    ) -> Result<(), EngineError> {
        out.tokens.clear();
        out.probs.clear();
        out.class = 0;
        Ok(())
    }
}

/// Counters of speculative decoding, summed over its steps.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SpecStats {
    /// Target forwards that verified a drafted block.
    pub verify_steps: u64,
    /// Target forwards of a single token (nothing drafted).
    pub plain_steps: u64,
    /// Tokens drafted and sent to verification.
    pub drafted: u64,
    /// Drafted tokens the target accepted.
    pub accepted: u64,
}

impl SpecStats {
    /// Accepted over drafted tokens (0 when nothing was drafted).
    pub fn acceptance(&self) -> f64 {
        if self.drafted == 0 {
            0.0
        } else {
            self.accepted as f64 / self.drafted as f64
        }
    }
}

/// Weight of a new sample in the moving averages.
const EWMA: f64 = 0.15;

/// Plain steps between probes of drafting while the model says it does not pay, at
/// first (lookup; a draft model's probes cost a catch-up, so it waits longer); each
/// probe that still does not pay doubles it, up to [`PROBE_MAX`].
const PROBE_MIN: u32 = 16;
const PROBE_MIN_MODEL: u32 = 64;
const PROBE_MAX: u32 = 512;

/// Acceptance classes: 0 for a draft model, the n-gram length for lookup.
const CLASSES: usize = NGRAM_MAX + 1;

/// The measured costs and acceptance behind the depth choice.
#[derive(Debug, Clone)]
struct Controller {
    depths: Vec<usize>,
    /// Seconds of a target forward of `depths[i] + 1` tokens, once measured.
    verify: Vec<Option<f64>>,
    /// Seconds of a plain one-token step, once measured.
    plain: Option<f64>,
    /// Seconds per drafted token (draft-model catch-up included).
    draft: f64,
    /// Per class, the probability that a drafted token is accepted given the ones before
    /// it were.
    alpha: [f64; CLASSES],
    /// Plain steps left before the next probe, and the current probe interval.
    until_probe: u32,
    interval: u32,
    min_interval: u32,
    /// Index into `depths` of the deepest depth allowed now: it starts at the smallest
    /// and grows one setting at a time, each time a block at the deepest allowed depth is
    /// accepted whole, so a deep block is only ever risked after measured success.
    level: usize,
    /// Whether the depth just allowed has its verify cost still unmeasured: it is tried
    /// once (an estimate alone would never be corrected).
    explore: bool,
    /// Whether the costs are fixed estimates that no timing updates (see
    /// [`Controller::fix_costs`]): the depth then follows the acceptance alone.
    fixed_costs: bool,
}

/// The acceptance every class starts from: pessimistic, so that nothing is drafted on
/// faith (at these costs, a depth-1 block pays from about 35% acceptance); the first
/// probes measure it, and drafting grows only on measured acceptance.
const ALPHA_PRIOR: f64 = 0.3;

/// How much faster than plain decode a depth must be expected to run to be chosen: near
/// break-even the noise of the estimates would make drafting lose as often as it wins.
const PAY_MARGIN: f64 = 1.05;

/// What a verify width costs before it is measured: a plain step plus this share of one
/// per extra token (measured on CPU: widths 2, 4 and 8 cost 1.3, 1.7 and 3.3 steps).
const EXTRA_TOKEN_COST: f64 = 0.3;

impl Controller {
    fn new(max: usize, runs_model: bool) -> Self {
        let depths = depth_set(max);
        let n = depths.len();
        Controller {
            depths,
            verify: vec![None; n],
            plain: None,
            draft: 0.0,
            alpha: [ALPHA_PRIOR; CLASSES],
            until_probe: 0,
            interval: if runs_model {
                PROBE_MIN_MODEL
            } else {
                PROBE_MIN
            },
            min_interval: if runs_model {
                PROBE_MIN_MODEL
            } else {
                PROBE_MIN
            },
            level: 0,
            explore: false,
            fixed_costs: false,
        }
    }

    /// Replaces the measured costs by estimates in units of a plain step: a draft step
    /// costs `draft_ratio` of one (the share of the target's weight bytes it reads) and a
    /// verify width the [`EXTRA_TOKEN_COST`] model. From then on no timing moves a
    /// choice, so the choices, and with them every random draw, are a function of the
    /// seed and the text alone.
    fn fix_costs(&mut self, draft_ratio: f64) {
        self.fixed_costs = true;
        self.plain = Some(1.0);
        self.draft = draft_ratio;
        self.verify.iter_mut().for_each(|v| *v = None);
        self.explore = false;
    }

    fn verify_cost(&self, i: usize) -> f64 {
        let plain = self.plain.unwrap_or(1.0);
        self.verify[i].unwrap_or(plain * (1.0 + EXTRA_TOKEN_COST * self.depths[i] as f64))
    }

    /// Expected tokens per second of depth `depths[i]` for acceptance class `class`.
    fn rate(&self, i: usize, class: usize) -> f64 {
        let a = self.alpha[class].clamp(0.0, 0.999);
        let d = self.depths[i];
        let tokens = (1.0 - a.powi(d as i32 + 1)) / (1.0 - a);
        tokens / (self.verify_cost(i) + self.draft * d as f64)
    }

    /// The depth to draft for `class` with at most `avail` tokens available.
    fn choose(&mut self, class: usize, avail: usize) -> usize {
        // Every estimate is relative to a plain step: measure one first.
        let Some(plain) = self.plain else {
            return 0;
        };
        if std::mem::take(&mut self.explore) {
            if let Some(&d) = self.depths.get(self.level).filter(|&&d| d <= avail) {
                return d;
            }
        }
        let plain_rate = 1.0 / plain;
        let mut best = (0, plain_rate * PAY_MARGIN);
        for i in 0..=self.level.min(self.depths.len().saturating_sub(1)) {
            if self.depths[i] > avail {
                break;
            }
            let r = self.rate(i, class);
            if r > best.1 {
                best = (self.depths[i], r);
            }
        }
        if best.0 > 0 {
            self.interval = self.min_interval;
            return best.0;
        }
        // Not drafting: re-measure now and then, in case the text became predictable.
        if self.until_probe == 0 && avail >= self.depths.first().copied().unwrap_or(usize::MAX) {
            self.until_probe = self.interval;
            self.interval = (self.interval * 2).min(PROBE_MAX);
            return self.depths[0];
        }
        self.until_probe = self.until_probe.saturating_sub(1);
        0
    }

    fn ewma(old: &mut f64, new: f64) {
        *old += EWMA * (new - *old);
    }

    fn record_verify(&mut self, depth: usize, secs: f64) {
        if self.fixed_costs {
            return;
        }
        if depth == 0 {
            match &mut self.plain {
                Some(p) => Self::ewma(p, secs),
                None => self.plain = Some(secs),
            }
        } else if let Some(i) = self.depths.iter().position(|&d| d == depth) {
            match &mut self.verify[i] {
                Some(v) => Self::ewma(v, secs),
                None => self.verify[i] = Some(secs),
            }
        }
    }

    fn record_accept(&mut self, class: usize, drafted: usize, accepted: usize) {
        let a = &mut self.alpha[class.min(CLASSES - 1)];
        for i in 0..drafted.min(accepted + 1) {
            Self::ewma(a, if i < accepted { 1.0 } else { 0.0 });
        }
        let top = self.depths.get(self.level).copied().unwrap_or(0);
        if drafted >= top && accepted == drafted {
            let up = (self.level + 1).min(self.depths.len().saturating_sub(1));
            self.explore = up != self.level && self.verify[up].is_none();
            self.level = up;
        } else if accepted == 0 {
            // A block lost whole: back to the smaller depths until blocks succeed again.
            self.level = self.level.saturating_sub(1);
        }
    }
}

/// Speculative decoding over one sequence: a draft source, the adaptive depth and the
/// counters. One per sequence (a server slot has its own).
pub struct Speculator {
    source: Box<dyn DraftSource>,
    ctl: Controller,
    stats: SpecStats,
    /// A depth forced instead of the adaptive choice (tests and measurements).
    fixed: Option<usize>,
    /// Context length at the last draft-model proposal.
    drafted_to: usize,
    draft: Draft,
    batch: Vec<u32>,
    context: Vec<u32>,
}

impl Speculator {
    /// Speculation from `source`, drafting at most `draft_max` tokens per step.
    pub fn new(source: Box<dyn DraftSource>, draft_max: usize) -> Result<Self, EngineError> {
        check_draft_max(draft_max)?;
        let ctl = Controller::new(draft_max, source.runs_model());
        Ok(Speculator {
            source,
            ctl,
            stats: SpecStats::default(),
            fixed: None,
            drafted_to: 0,
            draft: Draft::default(),
            batch: Vec::new(),
            context: Vec::new(),
        })
    }

    /// The draft source's name.
    pub fn source_name(&self) -> &'static str {
        self.source.name()
    }

    /// The counters so far.
    pub fn stats(&self) -> SpecStats {
        self.stats
    }

    /// Drafts `depth` tokens at every step the context and the source allow, instead of
    /// the adaptive choice (`None` restores it): for tests and measurements.
    pub fn set_fixed_depth(&mut self, depth: Option<usize>) {
        self.fixed = depth;
    }

    /// The depth for this step: the fixed one, or the controller's choice.
    fn depth(&mut self, class: usize, avail: usize) -> usize {
        match self.fixed {
            Some(d) => d.min(avail),
            None => self.ctl.choose(class, avail),
        }
    }

    /// Drafts the block for one step: `history` holds the tokens at positions
    /// `0..history.len()`, `pending` the sampled token not yet run, and `room` the
    /// positions left from `history.len()` on. Returns the tokens to run (`pending`
    /// first, then the draft) at `history.len()`, all of whose rows are wanted.
    pub fn plan(
        &mut self,
        history: &[u32],
        pending: u32,
        room: usize,
        sampler: &Sampler,
    ) -> Result<&[u32], EngineError> {
        self.context.clear();
        self.context.extend_from_slice(history);
        self.context.push(pending);
        let max = self.fixed.unwrap_or(*self.ctl.depths.last().unwrap_or(&0));
        let cap = room.saturating_sub(1).min(max);
        self.draft.tokens.clear();
        self.draft.probs.clear();
        if cap > 0 {
            if self.source.runs_model() {
                // The depth is chosen before the draft runs, since drafting costs.
                let d = self.depth(0, cap);
                if d > 0 {
                    let t0 = Instant::now();
                    self.source
                        .propose(&self.context, d, sampler, &mut self.draft)?;
                    self.note_draft_cost(self.context.len(), t0.elapsed().as_secs_f64() / d as f64);
                }
            } else {
                self.source
                    .propose(&self.context, cap, sampler, &mut self.draft)?;
                let avail = self.draft.tokens.len();
                let d = if avail == 0 {
                    0
                } else {
                    self.depth(self.draft.class, avail)
                };
                self.draft.tokens.truncate(d);
            }
        }
        Ok(self.block(pending))
    }

    /// The block to run: `pending`, then the draft.
    fn block(&mut self, pending: u32) -> &[u32] {
        let d = self.draft.tokens.len();
        self.draft.probs.truncate(d);
        self.batch.clear();
        self.batch.push(pending);
        self.batch.extend_from_slice(&self.draft.tokens);
        &self.batch
    }

    /// Records the measured seconds per drafted token of a proposal at a context of
    /// `context_len` tokens.
    fn note_draft_cost(&mut self, context_len: usize, per_token: f64) {
        // A long catch-up (the prompt, or the tokens of a stretch without drafting) is no
        // measure of a draft step's cost.
        let behind = context_len.saturating_sub(self.drafted_to);
        let max = self.ctl.depths.last().copied().unwrap_or(0);
        if self.drafted_to > 0 && behind <= max + 2 && !self.ctl.fixed_costs {
            if self.ctl.draft == 0.0 {
                self.ctl.draft = per_token;
            } else {
                Controller::ewma(&mut self.ctl.draft, per_token);
            }
        }
        self.drafted_to = context_len;
    }

    /// Speculation whose drafts are made outside it, by a draft model shared with other
    /// sequences ([`MultiDraft`]): [`Self::depth_for`] says how many to draft, and
    /// [`Self::plan_drafted`] takes them.
    pub fn shared_draft(draft_max: usize) -> Result<Self, EngineError> {
        Self::new(Box::new(SharedDraft), draft_max)
    }

    /// For drafts made outside (see [`Self::shared_draft`]): the depth to draft this step
    /// with `room` positions left from the pending token's on; 0 decodes plainly.
    pub fn depth_for(&mut self, room: usize) -> usize {
        let max = self.fixed.unwrap_or(*self.ctl.depths.last().unwrap_or(&0));
        let cap = room.saturating_sub(1).min(max);
        if cap == 0 {
            return 0;
        }
        self.depth(0, cap)
    }

    /// For drafts made outside: the block to run (`pending`, then `drafted`, cut to the
    /// cap) at a context of `context_len` tokens (the pending one included), the draft
    /// having taken `secs` per drafted token. The drafts carry no distribution, so each
    /// row is sampled from the target and a drafted token is accepted when it is the
    /// sample.
    pub fn plan_drafted(
        &mut self,
        context_len: usize,
        pending: u32,
        drafted: &[u32],
        secs: f64,
    ) -> &[u32] {
        let max = self.fixed.unwrap_or(*self.ctl.depths.last().unwrap_or(&0));
        self.draft.tokens.clear();
        self.draft.probs.clear();
        self.draft.class = 0;
        self.draft
            .tokens
            .extend_from_slice(&drafted[..drafted.len().min(max)]);
        if !drafted.is_empty() {
            self.note_draft_cost(context_len, secs);
        }
        self.block(pending)
    }

    /// Verifies the planned block against the target's logits `rows` (one row per token
    /// of the block, `n_vocab` wide) from the forward that took `elapsed`: appends to
    /// `out` the accepted drafted tokens and then the target's own next token, each
    /// accepted into `sampler`. All tokens appended but the last have their KV rows
    /// written by the forward; the last is the new pending token.
    pub fn verify(
        &mut self,
        sampler: &mut Sampler,
        rows: &mut [f32],
        n_vocab: usize,
        elapsed: Duration,
        out: &mut Vec<u32>,
    ) {
        let d = self.draft.tokens.len();
        self.ctl.record_verify(d, elapsed.as_secs_f64());
        let mut accepted = 0;
        for (i, row) in rows.chunks_exact_mut(n_vocab).take(d + 1).enumerate() {
            let drafted = self.draft.tokens.get(i).copied();
            let (tok, ok) = match (drafted, self.draft.probs.get(i)) {
                (Some(x), Some(q)) if !sampler.params().is_greedy() => {
                    accept_or_resample(sampler, row, x, q)
                }
                _ => {
                    // Greedy, or a draft without a distribution: the target's own pick,
                    // exactly as plain decode makes it; a drafted token counts if equal.
                    let t = sampler.sample(row);
                    (t, drafted == Some(t))
                }
            };
            sampler.accept(tok);
            out.push(tok);
            if !ok {
                break;
            }
            if drafted.is_some() {
                accepted += 1;
            }
        }
        if d > 0 {
            self.ctl.record_accept(self.draft.class, d, accepted);
            self.stats.verify_steps += 1;
            self.stats.drafted += d as u64;
            self.stats.accepted += accepted as u64;
        } else {
            self.stats.plain_steps += 1;
        }
    }

    /// One step over a single-sequence engine: [`Self::plan`], one target forward of the
    /// block at `history.len()`, [`Self::verify`]. `history` must be what the engine's
    /// KV holds at `0..history.len()`.
    pub fn step(
        &mut self,
        engine: &mut Engine,
        sampler: &mut Sampler,
        history: &[u32],
        pending: u32,
        rows: &mut Vec<f32>,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        let room = engine.n_ctx().saturating_sub(history.len());
        // Under sampling a draft model's tokens are verified by the rejection rule, whose
        // draws depend on where blocks start and end; were the depth to follow timings,
        // a fixed seed would give different (equally distributed) texts from run to run.
        // Its costs are then estimated from the weight bytes each step reads instead.
        if !sampler.params().is_greedy() && !self.ctl.fixed_costs {
            if let Some(draft) = self.source.weight_bytes() {
                let target = file_weight_bytes(engine.file()).max(1);
                self.ctl.fix_costs(draft as f64 / target as f64);
            }
        }
        self.plan(history, pending, room, sampler)?;
        let t0 = Instant::now();
        let n = self.batch.len();
        engine.forward_into(&self.batch, history.len(), n, rows)?;
        let elapsed = t0.elapsed();
        let n_vocab = engine.n_vocab();
        self.verify(sampler, rows, n_vocab, elapsed, out);
        Ok(())
    }
}

/// The standard acceptance rule for a token `x` drawn from the draft's distribution `q`:
/// accept with probability `min(1, p(x)/q(x))`, else draw from `norm(max(0, p - q))`.
/// Returns the token and whether it is the drafted one.
fn accept_or_resample(
    sampler: &mut Sampler,
    row: &mut [f32],
    x: u32,
    q: &[(u32, f64)],
) -> (u32, bool) {
    let p = sampler.distribution(row);
    let mass = |d: &[(u32, f64)], t: u32| d.iter().find(|e| e.0 == t).map_or(0.0, |e| e.1);
    let (px, qx) = (mass(&p, x), mass(q, x));
    let r = sampler.uniform();
    if qx > 0.0 && r * qx < px {
        return (x, true);
    }
    let residual: Vec<(u32, f64)> = p
        .iter()
        .map(|&(t, pt)| (t, (pt - mass(q, t)).max(0.0)))
        .collect();
    // p == q up to rounding leaves no residual mass: then p itself is the distribution.
    let tok = if residual.iter().any(|e| e.1 > 0.0) {
        sampler.draw(&residual)
    } else {
        sampler.draw(&p)
    };
    (tok, false)
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

    #[test]
    fn the_depth_set_is_small_and_capped() {
        assert_eq!(depth_set(7), vec![1, 3, 7]);
        assert_eq!(depth_set(5), vec![1, 3, 5]);
        assert_eq!(depth_set(16), vec![1, 3, 7, 15, 16]);
        assert!(check_draft_max(0)
            .unwrap_err()
            .to_string()
            .contains("--draft-max"));
        assert!(check_draft_max(17)
            .unwrap_err()
            .to_string()
            .contains("--draft-max"));
    }

    #[test]
    fn drafting_stops_when_it_does_not_pay_and_is_probed_again() {
        let mut c = Controller::new(7, true);
        assert_eq!(c.choose(0, 7), 0, "a plain step is measured first");
        c.plain = Some(1.0);
        c.draft = 0.9;
        for i in 0..3 {
            c.verify[i] = Some(1.0 + 0.3 * c.depths[i] as f64);
        }
        c.alpha[0] = 0.1;
        // A probe first (the interval starts elapsed), then plain steps until the next.
        assert_eq!(c.choose(0, 7), 1);
        let plain = (0..PROBE_MIN_MODEL).filter(|_| c.choose(0, 7) == 0).count();
        assert_eq!(plain as u32, PROBE_MIN_MODEL);
        // A cheap, accurate draft drafts deep, once blocks were accepted whole.
        c.draft = 0.01;
        c.alpha[0] = 0.95;
        assert_eq!(
            c.choose(0, 7),
            1,
            "a deep block only after measured success"
        );
        c.record_accept(0, 1, 1);
        assert_eq!(c.choose(0, 7), 3);
        c.record_accept(0, 3, 3);
        assert_eq!(c.choose(0, 7), 7);
        assert_eq!(c.choose(0, 3), 3);
    }

    /// The depth choices of `c` over a fixed pattern of acceptance, each block's timing
    /// drawn from `timing` (seconds of a verify of `d` drafted tokens, step `i`).
    fn choices(mut c: Controller, timing: impl Fn(usize, usize) -> f64) -> Vec<usize> {
        let mut out = Vec::new();
        for i in 0..200 {
            let d = c.choose(0, 7);
            c.record_verify(d, timing(d, i));
            if d > 0 {
                // Whole blocks mostly, a lost one every seventh step.
                let accepted = if i % 7 == 3 { 0 } else { d };
                c.record_accept(0, d, accepted);
            }
            out.push(d);
        }
        out
    }

    #[test]
    fn with_fixed_costs_timings_never_move_the_depth() {
        let fixed = || {
            let mut c = Controller::new(7, true);
            c.fix_costs(0.3);
            c
        };
        let steady = |d: usize, _| 1.0 + 0.3 * d as f64;
        // A machine that slows down wide verifies now and then (another process, a
        // frequency change): measured costs follow it.
        let noisy = |d: usize, i: usize| {
            (1.0 + 0.3 * d as f64) * if i.is_multiple_of(5) { 3.0 } else { 1.0 }
        };
        assert_eq!(choices(fixed(), steady), choices(fixed(), noisy));
        assert!(choices(fixed(), steady).iter().any(|&d| d > 0), "it drafts");
        // Without fixed costs the same noise changes the choices: the test can fail.
        let measured = || {
            let mut c = Controller::new(7, true);
            c.draft = 0.3;
            c
        };
        assert_ne!(choices(measured(), steady), choices(measured(), noisy));
    }

    /// Decodes `n` tokens under the controller with simulated costs (a plain step costs
    /// 1, a verify of `d` drafted tokens `verify(d)`, each drafted token `draft`) and a
    /// source whose drafted tokens are each right with probability `accept` (a fixed
    /// pseudo-random stream). Returns the time per token against plain decode's 1, and
    /// the deepest depth used.
    fn simulate(
        runs_model: bool,
        accept: f64,
        verify: impl Fn(usize) -> f64,
        draft: f64,
        n: usize,
    ) -> (f64, usize) {
        let mut c = Controller::new(7, runs_model);
        // Lookup drafts from 4-gram matches here; a draft model has one class.
        let class = if runs_model { 0 } else { NGRAM_MAX };
        let mut rng = 0x9E37_79B9_7F4A_7C15u64;
        let mut uniform = move || {
            rng = rng
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (rng >> 11) as f64 / (1u64 << 53) as f64
        };
        let (mut time, mut tokens, mut deepest) = (0.0, 0, 0);
        while tokens < n {
            let d = c.choose(class, 7);
            deepest = deepest.max(d);
            let v = if d == 0 { 1.0 } else { verify(d) };
            c.record_verify(d, v);
            time += v + draft * d as f64;
            let mut acc = 0;
            while acc < d && uniform() < accept {
                acc += 1;
            }
            if d > 0 {
                // The speculator measures a draft token's cost from its second proposal.
                if runs_model && c.draft == 0.0 && deepest > 0 && time > v + 1.0 {
                    c.draft = draft;
                }
                c.record_accept(class, d, acc);
            }
            tokens += acc + 1;
        }
        (time / tokens as f64, deepest)
    }

    /// What verify widths 2, 4 and 8 cost on the CPU measured (1.3, 1.7, 3.3 steps).
    fn cpu_verify(d: usize) -> f64 {
        match d {
            1 => 1.3,
            2..=3 => 1.7,
            _ => 3.3,
        }
    }

    #[test]
    fn a_source_that_is_never_right_costs_at_most_a_few_percent() {
        // 96 tokens, the length the benchmarks decode: the start-up must be cheap too.
        for (runs_model, draft) in [(false, 0.0), (true, 0.4)] {
            let (ratio, _) = simulate(runs_model, 0.0, cpu_verify, draft, 96);
            assert!(
                ratio <= 1.03,
                "model {runs_model}: {ratio:.3} of plain decode's time per token"
            );
            let (ratio, _) = simulate(runs_model, 0.0, cpu_verify, draft, 2000);
            assert!(ratio <= 1.02, "model {runs_model}, long run: {ratio:.3}");
        }
    }

    #[test]
    fn a_source_that_is_mostly_right_reaches_the_deep_setting() {
        // Where a wide verify costs little more than a step (a memory-bound host), 90%
        // acceptance pays at the deepest setting; on the measured CPU, depth 3 wins.
        let cheap = |d: usize| 1.0 + 0.1 * d as f64;
        for runs_model in [false, true] {
            let draft = if runs_model { 0.05 } else { 0.0 };
            let (ratio, deepest) = simulate(runs_model, 0.9, cheap, draft, 200);
            assert_eq!(deepest, 7, "model {runs_model}");
            assert!(ratio < 0.5, "model {runs_model}: {ratio:.3}");
        }
        let (ratio, deepest) = simulate(false, 0.9, cpu_verify, 0.0, 200);
        assert!(deepest >= 3 && ratio < 0.7, "{deepest} {ratio:.3}");
    }
}
