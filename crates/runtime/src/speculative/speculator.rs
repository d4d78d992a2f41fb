//! The speculator: plans each step's block (the pending token, then a draft of the
//! chosen depth) and verifies it against the target's logits.

use std::time::{Duration, Instant};

use super::control::{check_draft_max, Controller};
use super::source::{file_weight_bytes, Draft, DraftSource};
use crate::engine::{Engine, EngineError};
use crate::sampling::Sampler;

/// The source of a [`Speculator`] whose drafts come from outside it (a draft model
/// shared by several sequences, [`MultiDraft`](super::MultiDraft)): proposing here drafts nothing.
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
        out.clear();
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

    /// The most tokens to draft in a step: the fixed depth, or the controller's cap.
    fn cap(&self) -> usize {
        self.fixed.unwrap_or(self.ctl.max_depth())
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
        let max = self.cap();
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
        if self.drafted_to > 0 && behind <= self.ctl.max_depth() + 2 {
            self.ctl.record_draft(per_token);
        }
        self.drafted_to = context_len;
    }

    /// Speculation whose drafts are made outside it, by a draft model shared with other
    /// sequences ([`MultiDraft`](super::MultiDraft)): [`Self::depth_for`] says how many to draft, and
    /// [`Self::plan_drafted`] takes them.
    pub fn shared_draft(draft_max: usize) -> Result<Self, EngineError> {
        Self::new(Box::new(SharedDraft), draft_max)
    }

    /// For drafts made outside (see [`Self::shared_draft`]): the depth to draft this step
    /// with `room` positions left from the pending token's on; 0 decodes plainly.
    pub fn depth_for(&mut self, room: usize) -> usize {
        let max = self.cap();
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
        let max = self.cap();
        self.draft.clear();
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
        if !sampler.params().is_greedy() && !self.ctl.fixed_costs() {
            if let Some(draft) = self.source.weight_bytes() {
                let target = file_weight_bytes(engine.file()).max(1);
                self.ctl.fix_costs(draft as f64 / target as f64);
            }
        }
        self.plan(history, pending, room, sampler)?;
        let t0 = Instant::now();
        let n = self.batch.len();
        // Recurrent state cannot be rewound by a position: keep the state from before the
        // block, and after a rejection put it back and run the kept tokens again.
        let snap = if n > 1 {
            engine.snapshot_recurrent()
        } else {
            None
        };
        engine.forward_into(&self.batch, history.len(), n, rows)?;
        let elapsed = t0.elapsed();
        let n_vocab = engine.n_vocab();
        let before = out.len();
        self.verify(sampler, rows, n_vocab, elapsed, out);
        // The block's tokens the sequence keeps: the pending one and the accepted drafts
        // (every appended token but the new pending one).
        let kept = out.len() - before;
        if let Some(snap) = snap.filter(|_| kept < n) {
            engine.restore_recurrent(&snap)?;
            let mut scratch = Vec::new();
            engine.forward_into(&self.batch[..kept], history.len(), 1, &mut scratch)?;
        }
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
