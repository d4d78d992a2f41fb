//! Draft models: a second, smaller model with the target's vocabulary drafting for one
//! sequence ([`DraftModel`]) or for a server's slots at once ([`MultiDraft`]).

use minfer_gguf::GgufFile;
use minfer_tokenizer::Tokenizer;

use super::source::{file_weight_bytes, Draft, DraftSource};
use crate::engine::{Engine, EngineError};
use crate::history::common_prefix;
use crate::multi::{MultiEngine, SeqStep};
use crate::sampling::{Sampler, SamplingParams};

/// The error refusing a draft model, saying why.
fn refuse(message: String) -> EngineError {
    EngineError::Param {
        name: "draft model",
        message,
    }
}

/// Refuses a draft whose vocabulary differs from the target's, naming the first
/// difference: the size, a token's bytes, or a special id.
pub fn check_same_vocab(target: &Tokenizer, draft: &Tokenizer) -> Result<(), EngineError> {
    let bad = |message: String| Err(refuse(message));
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

/// Refuses a draft model (its `file`, its logits rows `n_vocab` wide) unless its
/// vocabulary is the target's (`target` is the target's tokenizer).
fn check_draft(file: &GgufFile, n_vocab: usize, target: &Tokenizer) -> Result<(), EngineError> {
    let tok = Tokenizer::from_gguf(file).map_err(|e| refuse(format!("its tokenizer: {e}")))?;
    check_same_vocab(target, &tok)?;
    if n_vocab != target.n_vocab() {
        return Err(refuse(format!(
            "its logits rows have {n_vocab} entries and the vocabulary {}",
            target.n_vocab()
        )));
    }
    Ok(())
}

/// The sampler in `slot` when it has `params`, else a fresh chain of them put there
/// (never the target's grammar: drafts only need its penalties and biases).
fn sampler_for<'s>(
    slot: &'s mut Option<Sampler>,
    params: &SamplingParams,
) -> Result<&'s mut Sampler, EngineError> {
    if slot.as_ref().is_some_and(|s| s.params() != params) {
        *slot = None;
    }
    match slot {
        Some(s) => Ok(s),
        None => Ok(slot.insert(
            Sampler::new(params.clone()).map_err(|e| EngineError::Param {
                name: "sampling",
                message: e.to_string(),
            })?,
        )),
    }
}

/// The tokens a draft's KV rows hold, following the target's context.
#[derive(Debug, Default)]
struct DraftKv {
    /// Where the draft's view of the context starts: a new context runs whole, but a
    /// draft that fell far behind on a context it shares (the depth chose plain decode
    /// for a while) restarts from its last [`DRAFT_WINDOW`] tokens instead of catching
    /// up on all of them.
    base: usize,
    /// The tokens whose KV rows the draft holds, at positions `0..kv.len()`: the context
    /// from `base` on.
    kv: Vec<u32>,
}

impl DraftKv {
    /// Lines the rows up with `context`, of which the draft's engine holds `held` rows:
    /// the common prefix stays, but at least the last token runs again, for its logits;
    /// a new context (nothing in common) runs whole, and far behind, the draft restarts
    /// on the context's tail (its predictions are local anyway). Returns the position to
    /// run from and the tokens to run there, already counted as held.
    fn catch_up<'c>(
        &mut self,
        context: &'c [u32],
        held: usize,
        resume: impl Fn(usize) -> usize,
    ) -> (usize, &'c [u32]) {
        let view = context.get(self.base..).unwrap_or_default();
        let keep = common_prefix(&self.kv, view)
            .min(view.len().saturating_sub(1))
            .min(held);
        // Rows the draft's sliding-window rings dropped run again, and a recurrent
        // draft's state goes on from its end or a checkpoint.
        let mut keep = resume(keep).min(keep);
        if keep == 0 {
            self.base = 0;
        } else if view.len() - keep > DRAFT_CATCHUP_MAX {
            self.base = context.len().saturating_sub(DRAFT_WINDOW);
            keep = 0;
        }
        let view = context.get(self.base..).unwrap_or_default();
        let run = view.get(keep..).unwrap_or_default();
        self.kv.truncate(keep);
        self.kv.extend_from_slice(run);
        (keep, run)
    }

    /// Forgets every row: the next proposal runs its whole context.
    fn forget(&mut self) {
        self.kv.clear();
        self.base = 0;
    }
}

/// A second, smaller model with the target's vocabulary: its own engine (backends,
/// weight registry and `GraphCache`), its own KV, following the target's tokens.
pub struct DraftModel {
    engine: Engine,
    /// The tokens the draft engine's KV rows hold.
    rows: DraftKv,
    /// The draft's own sampler: the target's parameters, a separate random stream.
    sampler: Option<Sampler>,
    logits: Vec<f32>,
}

impl DraftModel {
    /// A draft over `engine`, refused unless its vocabulary is the target's (`target`
    /// is the target's tokenizer) and its context is at least `n_ctx`.
    pub fn new(engine: Engine, target: &Tokenizer, n_ctx: usize) -> Result<Self, EngineError> {
        check_draft(engine.file(), engine.n_vocab(), target)?;
        if engine.n_ctx() < n_ctx {
            return Err(refuse(format!(
                "its context holds {} tokens, the target's {n_ctx}",
                engine.n_ctx()
            )));
        }
        Ok(DraftModel {
            engine,
            rows: DraftKv::default(),
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
        out.clear();
        let room = self.engine.n_ctx().saturating_sub(context.len());
        let max = max.min(room);
        if max == 0 || context.is_empty() {
            return Ok(());
        }
        // The target's parameters: the stream is reseeded and the penalty window copied
        // below.
        let sampler = sampler_for(&mut self.sampler, target.params())?;
        // The draft's stream is a function of the seed and the position alone, so a
        // fixed seed gives the same drafts (and output) however generations interleave.
        sampler.reseed(
            target.params().seed
                ^ DRAFT_SEED_MIX
                ^ (context.len() as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        sampler.copy_window_from(target);
        // One forward catches up on what the draft's rows miss of the context.
        let engine = &self.engine;
        let (keep, run) = self
            .rows
            .catch_up(context, engine.seq_len(), |k| engine.resume_point(k));
        match self.engine.prefill(run, keep) {
            Ok(logits) => self.logits = logits,
            Err(e) => {
                self.rows.kv.truncate(keep);
                return Err(e);
            }
        }
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
                let pos = self.rows.kv.len();
                self.engine.forward_into(&[x], pos, 1, &mut self.logits)?;
                self.rows.kv.push(x);
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
    /// The tokens the slot's KV rows hold.
    rows: DraftKv,
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
        check_draft(engine.file(), engine.n_vocab(), target)?;
        let bad = |message: String| Err(refuse(message));
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
            s.rows.forget();
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
            sampler_for(&mut seq.sampler, &params)?.copy_window_from(a.target);
            let held = self.engine.slot_len(a.slot)?;
            let engine = &self.engine;
            let (keep, run) = seq
                .rows
                .catch_up(a.context, held, |k| engine.resume_point(a.slot, k));
            steps.push(SeqStep {
                slot: a.slot,
                tokens: run.to_vec(),
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
                        pos0: seq.rows.kv.len(),
                        n_out: 1,
                    });
                    seq.rows.kv.push(x);
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
