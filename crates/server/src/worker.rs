//! The inference worker: one thread owns the `MultiEngine` and every slot. Each turn it
//! admits queued requests into free slots (prefilling only what follows the longest
//! prefix the slot already holds), samples one token for every decoding slot, and runs
//! all of their next tokens through a single `step`. A request for `n` choices takes `n`
//! free slots at once: its prompt is prefilled in one of them, and the others start from
//! copies of those KV rows (`MultiEngine::copy_prefix`), each with its own sampler.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use minfer_runtime::{
    DraftAsk, EngineError, EngineOptions, KvHistory, MultiDraft, MultiEngine, NgramLookup,
    Prefetch, Sampler, SeqStep, Speculator, StopEvent, StopScanner,
};
use minfer_tokenizer::{StreamDecoder, Tokenizer};
use tokio::sync::mpsc;

use crate::error::ApiError;
use crate::job::{choice_seed, logprob_of};
pub use crate::job::{
    Candidate, Event, Fault, Finish, Job, SlotInfo, Summary, TokenLogprob, EVENT_CAPACITY,
};
use crate::metrics::Metrics;

/// The HTTP side's handle: a bounded queue into the worker.
#[derive(Clone)]
pub struct WorkerHandle {
    /// Unbounded underneath so that nothing is reserved for the configured capacity up
    /// front (a bounded std channel allocates every slot at creation); `pending` and
    /// `capacity` bound it instead.
    queue: Sender<Job>,
    /// Jobs sent but not yet received by the worker.
    pending: Arc<AtomicUsize>,
    /// Most jobs that may wait at once.
    capacity: usize,
    /// Shared counters.
    pub metrics: Arc<Metrics>,
    /// Latest per-slot snapshot.
    pub slots: Arc<Mutex<Vec<SlotInfo>>>,
    /// Slot save/restore/erase actions, run by the worker between steps.
    slot_ops: Sender<crate::slots::SlotOp>,
}

impl WorkerHandle {
    /// Hands a slot action to the worker, which answers on the op's channel.
    pub fn slot_op(&self, op: crate::slots::SlotOp) -> Result<(), ApiError> {
        self.slot_ops
            .send(op)
            .map_err(|_| ApiError::internal("the inference worker has stopped"))
    }

    /// Queues a job; a full queue is a 503 with Retry-After.
    pub fn submit(&self, job: Job) -> Result<(), ApiError> {
        // A place is taken before the send, so concurrent submits never exceed capacity.
        if self.pending.fetch_add(1, Ordering::AcqRel) >= self.capacity {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            return Err(ApiError::unavailable(
                "all slots are busy and the request queue is full; retry later",
                1,
            ));
        }
        // Counted before the send so the worker's decrement can never run first.
        self.metrics.queue_delta(true);
        match self.queue.send(job) {
            Ok(()) => Ok(()),
            Err(_) => {
                self.pending.fetch_sub(1, Ordering::AcqRel);
                self.metrics.queue_delta(false);
                Err(ApiError::internal("the inference worker has stopped"))
            }
        }
    }
}

/// Facts about the loaded model that the HTTP side needs.
pub struct Loaded {
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// Positions per slot.
    pub slot_ctx: usize,
    /// `general.name`, if any.
    pub name: Option<String>,
    /// The model's digest (tensor table and sampled weights).
    pub digest: [u8; 32],
}

/// How the worker's slots decode speculatively.
#[derive(Debug, Clone, Default)]
pub enum Speculation {
    /// Plain decode.
    #[default]
    Off,
    /// N-gram lookup, drafting at most `max` tokens a step.
    Lookup {
        /// Most tokens drafted a step.
        max: usize,
        /// A depth forced at every step instead of the adaptive one (tests).
        fixed: Option<usize>,
    },
    /// A draft model at `path`, loaded with `opts` (the target's context given to it),
    /// with a slot per target slot; at most `max` tokens drafted a step.
    Draft {
        /// The draft model's file.
        path: std::path::PathBuf,
        /// Most tokens drafted a step.
        max: usize,
        /// A depth forced at every step instead of the adaptive one (tests).
        fixed: Option<usize>,
        /// How to build its engine.
        opts: EngineOptions,
    },
}

/// Loads the draft of `speculation`, if it has one, beside `target`: the same slots of
/// the same length, a vocabulary the target's (refused by name otherwise).
fn load_draft(
    speculation: &Speculation,
    target: &MultiEngine,
    tok: &Tokenizer,
) -> Result<Option<MultiDraft>, String> {
    let Speculation::Draft { path, opts, .. } = speculation else {
        return Ok(None);
    };
    let mut opts = opts.clone();
    opts.n_ctx = Some(target.engine().n_ctx());
    let named = |e: EngineError| format!("--draft {}: {e}", path.display());
    let engine = MultiEngine::load(path, &opts, target.n_slots()).map_err(named)?;
    MultiDraft::new(engine, tok, target.n_slots(), target.slot_ctx())
        .map(Some)
        .map_err(named)
}

/// Starts the worker thread: it loads the model with `load`, reports the result, then
/// serves the queue until every handle is dropped.
pub fn spawn(
    load: impl FnOnce() -> Result<MultiEngine, EngineError> + Send + 'static,
    queue_capacity: usize,
    metrics: Arc<Metrics>,
    busy_total: Arc<AtomicUsize>,
    speculation: Speculation,
) -> Result<(WorkerHandle, Loaded, std::thread::JoinHandle<()>), String> {
    let (qtx, qrx) = std::sync::mpsc::channel::<Job>();
    let (otx, orx) = std::sync::mpsc::channel::<crate::slots::SlotOp>();
    let pending = Arc::new(AtomicUsize::new(0));
    let pending2 = Arc::clone(&pending);
    let slots = Arc::new(Mutex::new(Vec::new()));
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let (m2, s2) = (Arc::clone(&metrics), Arc::clone(&slots));
    let thread = std::thread::Builder::new()
        .name("minfer-infer".into())
        .spawn(move || {
            // The engine is built on this thread and never leaves it.
            let engine = match load() {
                Ok(e) => e,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("loading the model: {e}")));
                    return;
                }
            };
            let tokenizer = match Tokenizer::from_gguf(engine.file()) {
                Ok(t) => Arc::new(t),
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("reading the tokenizer: {e}")));
                    return;
                }
            };
            let draft = match load_draft(&speculation, &engine, &tokenizer) {
                Ok(d) => d,
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    return;
                }
            };
            let loaded = Loaded {
                tokenizer: Arc::clone(&tokenizer),
                slot_ctx: engine.slot_ctx(),
                name: engine
                    .file()
                    .get_str("general.name")
                    .ok()
                    .map(str::to_string),
                digest: engine.engine().model_digest(),
            };
            // The slots are published before the server is reported ready, so /slots
            // never shows an empty list to the first client.
            let mut worker = Worker::new(engine, tokenizer, m2, s2, busy_total);
            match speculation {
                Speculation::Off => {}
                Speculation::Lookup { max, fixed } => {
                    worker.lookup = Some(max);
                    worker.spec_fixed = fixed;
                }
                Speculation::Draft { max, fixed, .. } => {
                    worker.draft_max = max;
                    worker.spec_fixed = fixed;
                }
            }
            worker.draft = draft;
            let _ = ready_tx.send(Ok(loaded));
            worker.run(qrx, orx, &pending2);
        })
        .map_err(|e| format!("starting the inference thread: {e}"))?;
    let loaded = ready_rx
        .recv()
        .map_err(|_| "the inference thread ended while loading".to_string())??;
    let handle = WorkerHandle {
        queue: qtx,
        pending,
        capacity: queue_capacity,
        metrics,
        slots,
        slot_ops: otx,
    };
    Ok((handle, loaded, thread))
}

struct Active {
    job: Job,
    /// The choice this slot generates, in `0..job.n`.
    choice: usize,
    /// Slots of the other choices, waiting for this one's prefill to be copied to them.
    followers: Vec<usize>,
    sampler: Sampler,
    decoder: StreamDecoder,
    stops: StopScanner,
    generated: usize,
    cached_tokens: usize,
    /// Prompt tokens still to run (after the kept prefix); they join the next step.
    prefill: Option<Vec<u32>>,
    logits: Option<Vec<f32>>,
    outbox: VecDeque<Event>,
    logprobs: Vec<TokenLogprob>,
    last_token: Option<Instant>,
    done: bool,
    /// When the job entered its slot (start of its prompt processing).
    admitted: Instant,
    /// When its first token was sampled (end of its prompt processing).
    first_sample: Option<Instant>,
    /// Speculative decoding of this request (n-gram lookup), when the server runs it.
    spec: Option<Speculator>,
    /// The next token, sampled by a verify step and not yet emitted.
    next: Option<u32>,
    /// Its log-probabilities (from its verify row), when the request asks for them.
    next_logprob: Option<TokenLogprob>,
    /// Whether the slot's entry in the current step is a speculative block to verify.
    verifying: bool,
}

struct Slot {
    /// Tokens whose KV sits at positions `0..cached.len()`.
    cached: KvHistory,
    active: Option<Active>,
    last_used: u64,
    last_prompt: usize,
    last_generated: usize,
}

struct Worker {
    engine: MultiEngine,
    tok: Arc<Tokenizer>,
    metrics: Arc<Metrics>,
    info: Arc<Mutex<Vec<SlotInfo>>>,
    /// Busy slots of every model's worker together (the `busy_slots` gauge), and this
    /// worker's share of it as last published.
    busy_total: Arc<AtomicUsize>,
    busy_mine: std::cell::Cell<usize>,
    /// This worker's share of the KV gauges as last published: (tokens held, positions).
    kv_mine: std::cell::Cell<(usize, usize)>,
    slots: Vec<Slot>,
    clock: u64,
    /// A request for more choices than there are free slots: it waits, ahead of the
    /// queue, until enough slots are free.
    waiting: Option<Job>,
    /// Speculative decoding with n-gram lookup, at most this many drafted tokens a step.
    lookup: Option<usize>,
    /// Speculative decoding with a draft model, a slot per slot, at most `draft_max`
    /// drafted tokens a step.
    draft: Option<MultiDraft>,
    draft_max: usize,
    /// A draft depth forced at every step instead of the adaptive one (tests).
    spec_fixed: Option<usize>,
}

fn panic_text(p: &(dyn std::any::Any + Send)) -> String {
    p.downcast_ref::<&str>()
        .map(|s| s.to_string())
        .or_else(|| p.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "unknown panic".into())
}

impl Worker {
    fn new(
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
        };
        w.publish();
        w
    }

    fn run(
        mut self,
        queue: Receiver<Job>,
        ops: Receiver<crate::slots::SlotOp>,
        pending: &AtomicUsize,
    ) {
        let mut closed = false;
        loop {
            while let Ok(op) = ops.try_recv() {
                self.slot_op(op);
            }
            let busy = self.slots.iter().any(|s| s.active.is_some());
            if closed && !busy {
                // This model's share of the KV gauges leaves with it.
                self.metrics.move_kv(self.kv_mine.get(), (0, 0));
                return;
            }
            let t0 = Instant::now();
            let mut progressed = false;
            // A waiting request of several choices goes first (requests stay in order).
            if let Some(job) = self.waiting.take() {
                progressed |= self.admit(job);
            }
            // Admit while a slot is free; block briefly only when there is nothing to run.
            while !closed && self.waiting.is_none() && self.slots.iter().any(|s| s.active.is_none())
            {
                let idle = !self.slots.iter().any(|s| s.active.is_some());
                let job = if idle {
                    match queue.recv_timeout(Duration::from_millis(100)) {
                        Ok(j) => j,
                        Err(RecvTimeoutError::Timeout) => break,
                        Err(RecvTimeoutError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                } else {
                    match queue.try_recv() {
                        Ok(j) => j,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            closed = true;
                            break;
                        }
                    }
                };
                pending.fetch_sub(1, Ordering::AcqRel);
                self.metrics.queue_delta(false);
                progressed = true;
                self.admit(job);
            }
            progressed |= self.decode_turn();
            progressed |= self.flush();
            if busy {
                self.metrics.add_busy(t0.elapsed());
            }
            self.publish();
            if !progressed && self.slots.iter().any(|s| s.active.is_some()) {
                // Every busy slot waits on a slow reader: do not spin.
                std::thread::sleep(Duration::from_millis(1));
            }
        }
    }

    /// Puts a job into the free slot holding the longest prefix of its prompt; the rest
    /// of the prompt is prefilled by the next step. A job of `n` choices also takes the
    /// `n - 1` least recently used other free slots, which start from a copy of that
    /// prefill; with fewer free slots it waits (returns false) until they are free.
    fn admit(&mut self, job: Job) -> bool {
        if job.tx.is_closed() {
            return true;
        }
        if Instant::now() >= job.deadline {
            let _ = job.tx.try_send(Event::Error(timed_out()));
            return true;
        }
        let n = job.n.max(1);
        let free = self.slots.iter().filter(|s| s.active.is_none()).count();
        if free < n {
            if n > self.slots.len() {
                // The HTTP side bounds `n` by the slot count; never wait forever.
                let _ = job.tx.try_send(Event::Error(ApiError::bad_request(format!(
                    "field `n` is {n}: must be in [1, {}], the slots of this model",
                    self.slots.len()
                ))));
                return true;
            }
            self.waiting = Some(job);
            return false;
        }
        if let Some(want) = job.slot {
            // The HTTP side checked the range; a busy slot cannot take the job now.
            if self.slots.get(want).is_none_or(|s| s.active.is_some()) {
                let _ = job.tx.try_send(Event::Error(ApiError::unavailable(
                    format!(
                        "slot {want} is busy with another request; retry later, or let the \
                         server pick a slot"
                    ),
                    1,
                )));
                return true;
            }
        }
        let Some(idx) = self
            .slots
            .iter()
            .enumerate()
            .filter(|(i, s)| s.active.is_none() && job.slot.is_none_or(|w| w == *i))
            .max_by_key(|(_, s)| (s.cached.matching(&job.prompt), u64::MAX - s.last_used))
            .map(|(i, _)| i)
        else {
            return false;
        };
        let mut others: Vec<usize> = (0..self.slots.len())
            .filter(|&i| i != idx && self.slots[i].active.is_none())
            .collect();
        others.sort_by_key(|&i| self.slots[i].last_used);
        others.truncate(n - 1);
        // Without `cache_prompt` nothing is kept: the whole prompt runs again.
        if !job.cache_prompt {
            self.slots[idx].cached.clear();
        }
        // The conversation engine's reuse rule: the longest held prefix, less the last
        // prompt token, whose logits start the generation.
        let keep = self.slots[idx].cached.reuse(&job.prompt).kept;
        self.metrics.add_prompt_tokens(job.prompt.len());
        let mut choices = Vec::with_capacity(n);
        for (choice, &slot) in std::iter::once(&idx).chain(&others).enumerate() {
            let mut job = job.clone();
            job.sampling.seed = choice_seed(job.sampling.seed, choice);
            let constraint = job
                .constraint
                .as_ref()
                .map(|(g, _)| g.start(Prefetch::Helper));
            let mut sampler = match Sampler::new(job.sampling.clone()) {
                Ok(s) => s.with_constraint(constraint),
                Err(e) => {
                    let _ = job
                        .tx
                        .try_send(Event::Error(ApiError::bad_request(e.to_string())));
                    return true;
                }
            };
            for &t in &job.prompt {
                sampler.accept(t);
            }
            choices.push((slot, choice, job, sampler));
        }
        for (slot_idx, choice, job, sampler) in choices {
            self.clock += 1;
            let spec = self.speculator(&job);
            let slot = &mut self.slots[slot_idx];
            slot.last_used = self.clock;
            slot.last_prompt = job.prompt.len();
            slot.last_generated = 0;
            let lead = choice == 0;
            slot.active = Some(Active {
                sampler,
                decoder: StreamDecoder::new(false),
                stops: StopScanner::new(&job.stop),
                generated: 0,
                cached_tokens: keep,
                // Only the first choice runs the prompt; the others wait for its rows.
                prefill: lead.then(|| job.prompt[keep..].to_vec()),
                followers: if lead { others.clone() } else { Vec::new() },
                choice,
                logits: None,
                outbox: VecDeque::new(),
                logprobs: Vec::new(),
                last_token: None,
                done: false,
                admitted: Instant::now(),
                first_sample: None,
                spec,
                next: None,
                next_logprob: None,
                verifying: false,
                job,
            });
        }
        true
    }

    /// A speculator for `job` when the server speculates. Requests under a grammar
    /// decode plainly (drafts are verified against the unconstrained chain). Requests for
    /// log-probabilities speculate: a verify row is bitwise the logits plain decode
    /// computes at its position, so each token's log-probabilities come from its row.
    fn speculator(&self, job: &Job) -> Option<Speculator> {
        if job.constraint.is_some() {
            return None;
        }
        let mut sp = if self.draft.is_some() {
            Speculator::shared_draft(self.draft_max).ok()?
        } else {
            Speculator::new(Box::new(NgramLookup::new()), self.lookup?).ok()?
        };
        sp.set_fixed_depth(self.spec_fixed);
        Some(sp)
    }

    /// Starts the other choices of the request in slot `lead`, whose prompt has just
    /// run: each follower slot gets a copy of its KV rows and of its last logits.
    fn fork(&mut self, lead: usize, logits: &[f32]) {
        let Some(a) = self.slots[lead].active.as_mut() else {
            return;
        };
        let followers = std::mem::take(&mut a.followers);
        let tx = a.job.tx.clone();
        let n = self.slots[lead].cached.len();
        for f in followers {
            let engine = &mut self.engine;
            match catch_unwind(AssertUnwindSafe(|| engine.copy_prefix(lead, f, n))) {
                Ok(Ok(())) => {
                    let history = self.slots[lead].cached.clone();
                    let slot = &mut self.slots[f];
                    slot.cached = history;
                    if let Some(fa) = slot.active.as_mut() {
                        fa.logits = Some(logits.to_vec());
                    }
                }
                Ok(Err(e)) => self.fail_slot(f, &tx, engine_error(e)),
                Err(p) => {
                    let msg = format!("inference panicked: {}", panic_text(&*p));
                    self.fail_slot(f, &tx, ApiError::internal(msg));
                }
            }
        }
    }

    /// Runs a slot action on an idle slot and answers it; a busy slot is a 409.
    fn slot_op(&mut self, op: crate::slots::SlotOp) {
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
    fn fail_slot(&mut self, idx: usize, tx: &mpsc::Sender<Event>, err: ApiError) {
        let _ = tx.try_send(Event::Error(err));
        let slot = &mut self.slots[idx];
        slot.cached.clear();
        slot.active = None;
        let _ = catch_unwind(AssertUnwindSafe(|| self.engine.reset_slot(idx)));
    }

    /// Samples one token for every ready slot, then runs all continuing slots and the
    /// prompts of newly admitted ones together in one step.
    fn decode_turn(&mut self) -> bool {
        let mut steps = Vec::new();
        // Slots whose draft model drafts this turn, all together after this loop:
        // (slot, pending token, its position).
        let mut to_draft = Vec::new();
        let shared_draft = self.draft.is_some();
        for idx in 0..self.slots.len() {
            let tok = Arc::clone(&self.tok);
            let metrics = Arc::clone(&self.metrics);
            let slot = &mut self.slots[idx];
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            if a.job.tx.is_closed() && a.outbox.is_empty() {
                // The client went away: free the slot now; its KV stays valid for reuse.
                slot.active = None;
                continue;
            }
            if a.job.tx.capacity() == 0 && Instant::now() >= a.job.deadline {
                // Past its deadline with a reader that has stopped taking events: nothing
                // more can reach it (the HTTP side ends it with a 504), so free the slot
                // instead of waiting on the reader; its KV stays valid for reuse.
                slot.active = None;
                continue;
            }
            if let Some(tokens) = a.prefill.take() {
                let fault = a.job.fault;
                let tx = a.job.tx.clone();
                // A fault attributed to one request fails only that request.
                if let Err(p) = catch_unwind(|| {
                    if fault == Some(Fault::Panic) {
                        panic!("injected fault");
                    }
                }) {
                    let msg = format!("inference panicked: {}", panic_text(&*p));
                    self.fail_slot(idx, &tx, ApiError::internal(msg));
                    continue;
                }
                let pos0 = slot.cached.len();
                slot.cached.extend(&tokens);
                metrics.add_prefilled(tokens.len());
                steps.push(SeqStep {
                    slot: idx,
                    tokens,
                    pos0,
                    n_out: 1,
                });
                continue;
            }
            if a.done || !a.outbox.is_empty() || (a.logits.is_none() && a.next.is_none()) {
                continue;
            }
            if Instant::now() >= a.job.deadline {
                a.outbox.push_back(Event::Error(timed_out()));
                a.done = true;
                continue;
            }
            let pos = slot.cached.len();
            let ctx = self.engine.slot_ctx();
            let r = catch_unwind(AssertUnwindSafe(|| sample_one(a, &tok, &metrics, pos, ctx)));
            match r {
                Ok(Some(t)) if shared_draft && a.spec.is_some() => {
                    slot.cached.push(t);
                    to_draft.push((idx, t, pos));
                }
                Ok(Some(t)) => {
                    // With speculation the step runs `t` and the tokens drafted after
                    // it, all rows wanted; `cached` gains the drafted ones once accepted.
                    let block = match a.spec.as_mut() {
                        Some(sp) => sp
                            .plan(slot.cached.tokens(), t, ctx - pos, &a.sampler)
                            .map(<[u32]>::to_vec),
                        None => Ok(vec![t]),
                    };
                    match block {
                        Ok(tokens) => {
                            a.verifying = a.spec.is_some();
                            slot.cached.push(t);
                            steps.push(SeqStep {
                                slot: idx,
                                n_out: tokens.len(),
                                tokens,
                                pos0: pos,
                            });
                        }
                        Err(e) => {
                            let tx = a.job.tx.clone();
                            self.fail_slot(idx, &tx, engine_error(e));
                        }
                    }
                }
                Ok(None) => {}
                Err(p) => {
                    let tx = a.job.tx.clone();
                    let msg = format!("inference panicked: {}", panic_text(&*p));
                    self.fail_slot(idx, &tx, ApiError::internal(msg));
                }
            }
            if let Some(a) = self.slots[idx].active.as_ref() {
                self.slots[idx].last_generated = a.generated;
            }
        }
        if !to_draft.is_empty() {
            self.draft_turn(&to_draft, &mut steps);
        }
        if steps.is_empty() {
            return false;
        }
        let slow = steps.iter().any(|s| {
            self.slots[s.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.job.fault == Some(Fault::Slow))
        });
        if slow {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.metrics.add_decode(steps.len());
        if self.has_fault(&steps, Fault::KernelPanic) {
            // Deep enough to be inside the first layer's kernels.
            self.engine.inject_kernel_panic(12);
        }
        let engine = &mut self.engine;
        let t0 = Instant::now();
        match catch_unwind(AssertUnwindSafe(|| engine.step(&steps))) {
            Ok(Ok(rows)) => {
                let elapsed = t0.elapsed();
                for (s, row) in steps.iter().zip(rows) {
                    let Some(a) = self.slots[s.slot].active.as_mut() else {
                        continue;
                    };
                    if std::mem::take(&mut a.verifying) {
                        self.verify(s, row, elapsed);
                        continue;
                    }
                    if !a.followers.is_empty() {
                        self.fork(s.slot, &row);
                    }
                    if let Some(a) = self.slots[s.slot].active.as_mut() {
                        a.logits = Some(row);
                    }
                }
            }
            Ok(Err(e)) => {
                let err = engine_error(e);
                self.fail_steps(&steps, err);
            }
            Err(p) => {
                let err = ApiError::internal(format!("inference panicked: {}", panic_text(&*p)));
                self.fail_steps(&steps, err);
            }
        }
        true
    }

    /// Drafts for every slot in `to_draft` (slot, pending token, its position) with the
    /// draft model, all of them in shared draft forwards, and adds each slot's block (the
    /// pending token, then what it drafted) to `steps`.
    fn draft_turn(&mut self, to_draft: &[(usize, u32, usize)], steps: &mut Vec<SeqStep>) {
        let ctx = self.engine.slot_ctx();
        let depths: Vec<usize> = to_draft
            .iter()
            .map(|&(idx, _, pos)| {
                self.slots[idx]
                    .active
                    .as_mut()
                    .and_then(|a| a.spec.as_mut())
                    .map_or(0, |sp| sp.depth_for(ctx - pos))
            })
            .collect();
        let deepest = depths.iter().copied().max().unwrap_or(0);
        let mut blocks: Vec<Vec<u32>> = Vec::new();
        let mut secs = 0.0;
        if let (Some(draft), true) = (self.draft.as_mut(), deepest > 0) {
            let slots = &self.slots;
            let asks: Vec<DraftAsk<'_>> = to_draft
                .iter()
                .zip(&depths)
                .filter_map(|(&(idx, _, _), &max)| {
                    let a = slots[idx].active.as_ref()?;
                    Some(DraftAsk {
                        slot: idx,
                        context: slots[idx].cached.tokens(),
                        max,
                        target: &a.sampler,
                    })
                })
                .collect();
            let t0 = Instant::now();
            let r = catch_unwind(AssertUnwindSafe(|| draft.propose(&asks, &mut blocks)));
            // Every drafting slot waited for the whole draft: its cost per drafted token
            // is the deepest draft's.
            secs = t0.elapsed().as_secs_f64() / deepest as f64;
            let asked: Vec<usize> = asks.iter().map(|a| a.slot).collect();
            drop(asks);
            let err = match r {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(engine_error(e)),
                Err(p) => {
                    for &idx in &asked {
                        draft.forget(idx);
                    }
                    let msg = format!("the draft model panicked: {}", panic_text(&*p));
                    Some(ApiError::internal(msg))
                }
            };
            if let Some(err) = err {
                for &(idx, _, _) in to_draft {
                    if let Some(tx) = self.slots[idx].active.as_ref().map(|a| a.job.tx.clone()) {
                        self.fail_slot(idx, &tx, err.clone());
                    }
                }
                return;
            }
            // `blocks` follows `asks`, which skipped the slots that do not draft.
            let mut it = blocks.into_iter();
            blocks = depths
                .iter()
                .map(|&d| {
                    if d > 0 {
                        it.next().unwrap_or_default()
                    } else {
                        Vec::new()
                    }
                })
                .collect();
        }
        for (i, &(idx, t, pos)) in to_draft.iter().enumerate() {
            let Some(a) = self.slots[idx].active.as_mut() else {
                continue;
            };
            let Some(sp) = a.spec.as_mut() else {
                continue;
            };
            let drafted = blocks.get(i).map_or(&[][..], Vec::as_slice);
            let tokens = sp.plan_drafted(pos + 1, t, drafted, secs).to_vec();
            a.verifying = true;
            steps.push(SeqStep {
                slot: idx,
                n_out: tokens.len(),
                tokens,
                pos0: pos,
            });
        }
    }

    /// Verifies a slot's speculative block against its logits rows: the accepted drafted
    /// tokens are emitted now (their KV rows are written: `cached` records them), and the
    /// target's own next token waits in `next` to be emitted and run by the next step.
    fn verify(&mut self, s: &SeqStep, mut rows: Vec<f32>, elapsed: Duration) {
        let n_vocab = self.engine.n_vocab();
        let ctx = self.engine.slot_ctx();
        let slot = &mut self.slots[s.slot];
        let Some(a) = slot.active.as_mut() else {
            return;
        };
        let Some(sp) = a.spec.as_mut() else {
            return;
        };
        let before = sp.stats();
        let mut out = Vec::with_capacity(s.tokens.len());
        // The sampler rewrites the rows it samples (penalties, biases): log-probabilities
        // are of the model's raw logits, as plain decode reports them.
        let raw = a.job.logprobs.map(|k| (k, rows.clone()));
        sp.verify(&mut a.sampler, &mut rows, n_vocab, elapsed, &mut out);
        let logprob = |i: usize, t: u32| {
            let (k, raw) = raw.as_ref()?;
            let row = raw.get(i * n_vocab..(i + 1) * n_vocab)?;
            Some(logprob_of(&self.tok, row, t, *k))
        };
        let after = sp.stats();
        self.metrics.add_draft(
            (after.drafted - before.drafted) as usize,
            (after.accepted - before.accepted) as usize,
        );
        let Some(next) = out.pop() else {
            return;
        };
        a.next_logprob = logprob(out.len(), next);
        for (i, &t) in out.iter().enumerate() {
            // `t` ran at this position; plain decode would have sampled it there.
            let pos = s.pos0 + 1 + i;
            if !self.tok.is_eog(t) {
                if let Some(lp) = logprob(i, t) {
                    a.logprobs.push(lp);
                }
            }
            if emit(a, &self.tok, &self.metrics, t, pos, ctx).is_none() {
                return;
            }
            slot.cached.push(t);
        }
        a.next = Some(next);
        slot.last_generated = a.generated;
    }

    /// Whether a request in `steps` asked for `fault`.
    fn has_fault(&self, steps: &[SeqStep], fault: Fault) -> bool {
        steps.iter().any(|s| {
            self.slots[s.slot]
                .active
                .as_ref()
                .is_some_and(|a| a.job.fault == Some(fault))
        })
    }

    fn fail_steps(&mut self, steps: &[SeqStep], err: ApiError) {
        for s in steps {
            if let Some(tx) = self.slots[s.slot].active.as_ref().map(|a| a.job.tx.clone()) {
                self.fail_slot(s.slot, &tx, err.clone());
            }
        }
    }

    /// Hands queued events to their requests; frees slots whose request is over.
    fn flush(&mut self) -> bool {
        let mut progressed = false;
        for idx in 0..self.slots.len() {
            let slot = &mut self.slots[idx];
            let Some(a) = slot.active.as_mut() else {
                continue;
            };
            while a.outbox.len() > 1 || (!a.done && !a.outbox.is_empty()) {
                let Some(ev) = a.outbox.pop_front() else {
                    break;
                };
                match a.job.tx.try_send(ev) {
                    Ok(()) => progressed = true,
                    Err(mpsc::error::TrySendError::Full(ev)) => {
                        a.outbox.push_front(ev);
                        break;
                    }
                    Err(mpsc::error::TrySendError::Closed(_)) => {
                        a.outbox.clear();
                        a.done = true;
                    }
                }
            }
            // The last event goes out only after the slot is released and published, so
            // a client that has its answer sees the slot free in /slots and /metrics.
            if a.done && a.outbox.len() <= 1 && (a.outbox.is_empty() || a.job.tx.capacity() > 0) {
                let last = a.outbox.pop_front();
                slot.last_generated = a.generated;
                let Some(a) = slot.active.take() else {
                    continue;
                };
                self.publish();
                if let Some(ev) = last {
                    // Sole sender with free capacity: this cannot be Full.
                    let _ = a.job.tx.try_send(ev);
                }
                progressed = true;
            }
        }
        progressed
    }

    fn publish(&self) {
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

fn timed_out() -> ApiError {
    ApiError::new(StatusCode::GATEWAY_TIMEOUT, "the request timed out")
}

fn engine_error(e: EngineError) -> ApiError {
    match e {
        EngineError::ContextOverflow { .. } | EngineError::BadToken { .. } => {
            ApiError::bad_request(e.to_string())
        }
        other => ApiError::internal(format!("inference failed: {other}")),
    }
}

/// Samples the next token of `a` from its pending logits; returns the token when the
/// generation continues (it must then run at position `pos`).
fn sample_one(
    a: &mut Active,
    tok: &Tokenizer,
    metrics: &Metrics,
    pos: usize,
    slot_ctx: usize,
) -> Option<u32> {
    let t = match a.next.take() {
        // Sampled by a verify step, already in the sampler's window.
        Some(t) => {
            if let Some(lp) = a.next_logprob.take().filter(|_| !tok.is_eog(t)) {
                a.logprobs.push(lp);
            }
            t
        }
        None => {
            let mut logits = a.logits.take()?;
            let raw = a.job.logprobs.map(|_| logits.clone());
            let t = match a.sampler.try_sample(&mut logits) {
                Ok(t) => t,
                Err(e) => {
                    // The grammar's own failure: the request ends with it, never
                    // unconstrained; a grammar past an engine limit is the caller's error.
                    let field = a.job.constraint.as_ref().map_or("grammar", |c| c.1);
                    let err = ApiError::constraint(field, &e);
                    a.outbox.push_back(Event::Error(err));
                    a.done = true;
                    return None;
                }
            };
            if !tok.is_eog(t) {
                if let (Some(k), Some(raw)) = (a.job.logprobs, raw) {
                    a.logprobs.push(logprob_of(tok, &raw, t, k));
                }
                a.sampler.accept(t);
            }
            t
        }
    };
    emit(a, tok, metrics, t, pos, slot_ctx)
}

/// Hands the sampled token `t` of `a` to its request (text, stop strings, limits);
/// returns it when the generation continues (it must then run at position `pos`).
fn emit(
    a: &mut Active,
    tok: &Tokenizer,
    metrics: &Metrics,
    t: u32,
    pos: usize,
    slot_ctx: usize,
) -> Option<u32> {
    let now = Instant::now();
    match a.last_token {
        None => metrics.observe_ttft(now - a.job.arrived),
        Some(prev) => metrics.observe_itl(now - prev),
    }
    a.last_token = Some(now);
    a.first_sample.get_or_insert(now);
    if tok.is_eog(t) {
        finish(a, metrics, Finish::Stop, true);
        return None;
    }
    a.generated += 1;
    metrics.add_generated(1);
    let piece = match a.decoder.push(tok, t) {
        Ok(p) => p,
        Err(_) => char::REPLACEMENT_CHARACTER.to_string(),
    };
    match a.stops.push(&piece) {
        StopEvent::Text(text) => {
            if !text.is_empty() || !a.logprobs.is_empty() {
                let logprobs = std::mem::take(&mut a.logprobs);
                a.outbox.push_back(Event::Chunk {
                    choice: a.choice,
                    text,
                    logprobs,
                });
            }
        }
        StopEvent::Stopped(text) => {
            let logprobs = std::mem::take(&mut a.logprobs);
            a.outbox.push_back(Event::Chunk {
                choice: a.choice,
                text,
                logprobs,
            });
            finish(a, metrics, Finish::Stop, false);
            return None;
        }
    }
    if a.generated >= a.job.max_tokens || pos + 1 > slot_ctx {
        finish(a, metrics, Finish::Length, true);
        return None;
    }
    Some(t)
}

/// Ends a generation; held-back text is released unless a stop string matched.
fn finish(a: &mut Active, metrics: &Metrics, reason: Finish, release: bool) {
    let mut rest = String::new();
    if release {
        rest = a.stops.finish();
        rest.push_str(&a.decoder.flush());
    }
    if !rest.is_empty() || !a.logprobs.is_empty() {
        let logprobs = std::mem::take(&mut a.logprobs);
        a.outbox.push_back(Event::Chunk {
            choice: a.choice,
            text: rest,
            logprobs,
        });
    }
    let now = Instant::now();
    let first = a.first_sample.unwrap_or(now);
    let stop_word = a
        .stops
        .matched()
        .and_then(|m| a.job.stop.iter().position(|s| s == m));
    let summary = Summary {
        choice: a.choice,
        finish: reason,
        prompt_tokens: a.job.prompt.len(),
        cached_tokens: a.cached_tokens,
        completion_tokens: a.generated,
        prompt_time: first.saturating_duration_since(a.admitted),
        predicted_time: now.saturating_duration_since(first),
        stop_word,
    };
    // The prompt ran once for all choices: only the first counts its time, as the
    // prefill counter counts its tokens once.
    let prompt_time = if a.choice == 0 {
        summary.prompt_time
    } else {
        Duration::ZERO
    };
    metrics.add_phase_times(prompt_time, summary.predicted_time);
    a.outbox.push_back(Event::Done(summary));
    a.done = true;
}
