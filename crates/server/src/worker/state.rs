//! The worker's state: its slots, each one's active request, and what admission and the
//! decode step share (failing a slot, publishing the slot snapshot and gauges).

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use axum::http::StatusCode;
use minfer_runtime::{
    EngineError, KvHistory, MultiDraft, MultiEngine, Sampler, Speculator, StopScanner,
};
use minfer_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::job::{Event, Job, SlotInfo, TokenLogprob};
use crate::metrics::Metrics;

/// The request a slot runs: its sampler, stop scanner, decoder and pending output.
pub(super) struct Active {
    pub(super) job: Job,
    /// The choice this slot generates, in `0..job.n`.
    pub(super) choice: usize,
    /// Slots of the other choices, waiting for this one's prefill to be copied to them.
    pub(super) followers: Vec<usize>,
    pub(super) sampler: Sampler,
    pub(super) decoder: StreamDecoder,
    pub(super) stops: StopScanner,
    pub(super) generated: usize,
    pub(super) cached_tokens: usize,
    /// Prompt tokens still to run (after the kept prefix); they join the next step.
    pub(super) prefill: Option<Vec<u32>>,
    pub(super) logits: Option<Vec<f32>>,
    pub(super) outbox: VecDeque<Event>,
    /// Log-probabilities of tokens whose text is not yet passed on (a possible stop
    /// string holds it back): they go out with their text, and those of a matched stop
    /// string's tokens, whose text is dropped, are dropped with it.
    pub(super) logprobs: Vec<TokenLogprob>,
    /// Where each of `logprobs`' tokens lies in the generated text, in bytes from its
    /// start.
    pub(super) lp_spans: Vec<(usize, usize)>,
    /// Bytes of generated text handed to the stop scanner, and passed on by it.
    pub(super) text_in: usize,
    pub(super) text_out: usize,
    pub(super) last_token: Option<Instant>,
    pub(super) done: bool,
    /// When the job entered its slot (start of its prompt processing).
    pub(super) admitted: Instant,
    /// When its first token was sampled (end of its prompt processing).
    pub(super) first_sample: Option<Instant>,
    /// Speculative decoding of this request (n-gram lookup), when the server runs it.
    pub(super) spec: Option<Speculator>,
    /// The next token, sampled by a verify step and not yet emitted.
    pub(super) next: Option<u32>,
    /// Its log-probabilities (from its verify row), when the request asks for them.
    pub(super) next_logprob: Option<TokenLogprob>,
    /// Whether the slot's entry in the current step is a speculative block to verify.
    pub(super) verifying: bool,
}

impl Active {
    /// The request's index of this slot's choice (a batch numbers its prompts' choices
    /// one after the other).
    pub(super) fn index(&self) -> usize {
        self.job.first_choice + self.choice
    }
}

/// One sequence of the engine: the tokens its KV holds and the request in it, if any.
pub(super) struct Slot {
    /// Tokens whose KV sits at positions `0..cached.len()`.
    pub(super) cached: KvHistory,
    pub(super) active: Option<Active>,
    pub(super) last_used: u64,
    pub(super) last_prompt: usize,
    pub(super) last_generated: usize,
}

/// The inference thread's state: the engine, its slots, and how they speculate.
pub(super) struct Worker {
    pub(super) engine: MultiEngine,
    pub(super) tok: Arc<Tokenizer>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) info: Arc<Mutex<Vec<SlotInfo>>>,
    /// Busy slots of every model's worker together (the `busy_slots` gauge), and this
    /// worker's share of it as last published.
    pub(super) busy_total: Arc<AtomicUsize>,
    pub(super) busy_mine: std::cell::Cell<usize>,
    /// This worker's share of the KV gauges as last published: (tokens held, positions).
    pub(super) kv_mine: std::cell::Cell<(usize, usize)>,
    pub(super) slots: Vec<Slot>,
    pub(super) clock: u64,
    /// A request for more choices than there are free slots: it waits, ahead of the
    /// queue, until enough slots are free.
    pub(super) waiting: Option<Job>,
    /// Speculative decoding with n-gram lookup, at most this many drafted tokens a step.
    pub(super) lookup: Option<usize>,
    /// Speculative decoding with a draft model, a slot per slot, at most `draft_max`
    /// drafted tokens a step.
    pub(super) draft: Option<MultiDraft>,
    pub(super) draft_max: usize,
    /// A draft depth forced at every step instead of the adaptive one (tests).
    pub(super) spec_fixed: Option<usize>,
    /// The prompt cache shared across slots and models, when on and when this engine's
    /// rows can move by position.
    pub(super) prompt_cache: Option<crate::prompt_cache::SharedPromptCache>,
    /// What this engine's rows depend on beyond their tokens (the cache's key root).
    pub(super) fingerprint: [u8; 32],
}

/// The message of a caught panic.
pub(super) fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Worker {
    /// A worker over `engine` with every slot empty, its snapshot published.
    pub(super) fn new(
        engine: MultiEngine,
        tok: Arc<Tokenizer>,
        metrics: Arc<Metrics>,
        info: Arc<Mutex<Vec<SlotInfo>>>,
        busy_total: Arc<AtomicUsize>,
    ) -> Self {
        let slots = (0..engine.n_slots())
            .map(|_| Slot {
                cached: KvHistory::new(),
                active: None,
                last_used: 0,
                last_prompt: 0,
                last_generated: 0,
            })
            .collect();
        let w = Worker {
            engine,
            tok,
            metrics,
            info,
            busy_total,
            busy_mine: std::cell::Cell::new(0),
            kv_mine: std::cell::Cell::new((0, 0)),
            slots,
            clock: 0,
            waiting: None,
            lookup: None,
            draft: None,
            draft_max: 0,
            spec_fixed: None,
            prompt_cache: None,
            fingerprint: [0; 32],
        };
        w.publish();
        w
    }

    /// Runs a slot action on an idle slot and answers it; a busy slot is a 409.
    pub(super) fn slot_op(&mut self, op: crate::slots::SlotOp) {
        let r = match self.slots.get_mut(op.slot) {
            None => Err(ApiError::bad_request(format!(
                "slot {} is not in 0..{}",
                op.slot,
                self.engine.n_slots()
            ))),
            Some(s) if s.active.is_some() => Err(ApiError::new(
                StatusCode::CONFLICT,
                format!(
                    "slot {} is busy with a request; retry when it is idle",
                    op.slot
                ),
            )),
            Some(s) => crate::slots::apply(&mut self.engine, &mut s.cached, &op),
        };
        let _ = op.reply.send(r);
        self.publish();
    }

    /// A failed slot's KV is suspect: forget it, and tell the request.
    pub(super) fn fail_slot(&mut self, idx: usize, tx: &mpsc::Sender<Event>, err: ApiError) {
        let _ = tx.try_send(Event::Error(err));
        let slot = &mut self.slots[idx];
        slot.cached.clear();
        slot.active = None;
        let _ = catch_unwind(AssertUnwindSafe(|| self.engine.reset_slot(idx)));
    }

    /// Publishes the slot snapshot (`/slots`) and this worker's share of the busy-slot and
    /// KV gauges.
    pub(super) fn publish(&self) {
        let busy = self.slots.iter().filter(|s| s.active.is_some()).count();
        let before = self.busy_mine.replace(busy);
        let total = if busy >= before {
            self.busy_total.fetch_add(busy - before, Ordering::AcqRel) + (busy - before)
        } else {
            self.busy_total.fetch_sub(before - busy, Ordering::AcqRel) - (before - busy)
        };
        self.metrics.set_busy_slots(total);
        let held: usize = self.slots.iter().map(|s| s.cached.len()).sum();
        if let Some(most) = self.slots.iter().map(|s| s.cached.len()).max() {
            self.metrics.observe_slot_tokens(most);
        }
        let kv = (held, self.slots.len() * self.engine.slot_ctx());
        self.metrics.move_kv(self.kv_mine.replace(kv), kv);
        let info = self
            .slots
            .iter()
            .enumerate()
            .map(|(id, s)| SlotInfo {
                id,
                n_ctx: self.engine.slot_ctx(),
                is_processing: s.active.is_some(),
                cached_tokens: s.cached.len(),
                prompt_tokens: s.last_prompt,
                generated_tokens: s.last_generated,
            })
            .collect();
        *self.info.lock().unwrap_or_else(|e| e.into_inner()) = info;
    }
}

/// 504: the request's deadline passed.
pub(super) fn timed_out() -> ApiError {
    ApiError::new(StatusCode::GATEWAY_TIMEOUT, "the request timed out")
}

/// An engine failure as the request's error: the request's own fault (context overflow,
/// a bad token) is a 400, any other a 500.
pub(super) fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::ContextOverflow { .. } | EngineError::BadToken { .. } => {
            ApiError::bad_request(e.to_string())
        }
        other => ApiError::internal(format!("inference failed: {other}")),
    }
}
