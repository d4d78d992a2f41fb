//! The inference worker: one thread owns the `MultiEngine` and every slot. Each turn it
//! admits queued requests into free slots (prefilling only what follows the longest
//! prefix the slot already holds), samples one token for every decoding slot, and runs
//! all of their next tokens through a single `step`. A request for `n` choices takes `n`
//! free slots at once: its prompt is prefilled in one of them, and the others start from
//! copies of those KV rows (`MultiEngine::copy_prefix`), each with its own sampler.
//!
//! `admit` takes queued jobs into slots (prefix reuse, choice forks, speculation setup);
//! `step` runs the batched decode step (sampling, verifying drafts, emitting events);
//! `state` holds the worker's slots and what both share.

mod admit;
mod cache;
mod state;
mod step;
mod tasks;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use minfer_runtime::{EngineError, EngineOptions, MultiDraft, MultiEngine};
use minfer_tokenizer::Tokenizer;

use crate::error::ApiError;
pub use crate::job::{
    Candidate, Event, Fault, Finish, Job, PromptProgress, SlotInfo, Summary, TokenLogprob,
    EVENT_CAPACITY,
};
use crate::metrics::Metrics;
use crate::task::Task;
use state::Worker;

/// What the queue carries: a generation, or a whole-text task.
enum Queued {
    /// Boxed: a job is far larger than a task.
    Gen(Box<Job>),
    Task(Task),
}

/// The HTTP side's handle: a bounded queue into the worker.
#[derive(Clone)]
pub struct WorkerHandle {
    /// Unbounded underneath so that nothing is reserved for the configured capacity up
    /// front (a bounded std channel allocates every slot at creation); `pending` and
    /// `capacity` bound it instead.
    queue: Sender<Queued>,
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
        self.enqueue(Queued::Gen(Box::new(job)))
    }

    /// Queues a whole-text task (embeddings, rerank) behind the jobs before it; a full
    /// queue is a 503 with Retry-After.
    pub fn submit_task(&self, task: Task) -> Result<(), ApiError> {
        self.enqueue(Queued::Task(task))
    }

    fn enqueue(&self, job: Queued) -> Result<(), ApiError> {
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
    /// How it pools embeddings unless `--pooling` says otherwise (its `pooling_type`,
    /// else mean).
    pub pooling: minfer_runtime::embed::Pooling,
    /// Scores per text of its classifier head, when it has one (a cross-encoder).
    pub rank_width: Option<usize>,
    /// Whether it is an encoder (no logits).
    pub encoder: bool,
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
    prompt_cache: Option<crate::prompt_cache::SharedPromptCache>,
) -> Result<(WorkerHandle, Loaded, std::thread::JoinHandle<()>), String> {
    let (qtx, qrx) = std::sync::mpsc::channel::<Queued>();
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
                pooling: minfer_runtime::embed::Pooling::default_for(engine.engine()),
                rank_width: engine.engine().rank_width(),
                encoder: engine.engine().is_encoder(),
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
            // A ringed sliding-window layer has dropped the rows a block needs: such a
            // model serves without the cache (`--swa-full` keeps them).
            if worker.engine.rows_portable() {
                worker.fingerprint = minfer_runtime::session::kv_fingerprint(&worker.engine);
                worker.prompt_cache = prompt_cache;
            }
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

impl Worker {
    /// Serves slot actions and the queue until every handle is dropped and the last
    /// request is over: each turn admits what fits, runs one decode step and flushes.
    fn run(
        mut self,
        queue: Receiver<Queued>,
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
                match job {
                    Queued::Gen(job) => {
                        self.admit(*job);
                    }
                    // A slot is free here, so the task runs now.
                    Queued::Task(task) => {
                        if let Some(task) = self.run_task(task) {
                            let _ = task.reply.send(Err(ApiError::internal("no idle slot")));
                        }
                    }
                }
            }
            if progressed {
                // Admitted requests count as running before their first step, which may be
                // a long prefill: a router reading the gauges must not see an idle worker.
                self.publish();
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
}
