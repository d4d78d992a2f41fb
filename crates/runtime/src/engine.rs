//! The engine: one model, its backends and its `GraphCache`, driven through
//! `forward_graph_cached` (design §10–§11). A graph is rebuilt only when the
//! `GraphParams` change (prefill → decode); positions and KV length are inputs.
//!
//! The KV regions and the graph outlive every step and every reset: a reset only says
//! that the next step starts a new sequence at position 0 (invariant 1, positions are
//! data). Attention reads rows `0..=pos` only, and a step may not start past the rows
//! its sequence has written, so no row of an earlier sequence is ever read.
//!
//! A step that unwinds (a panic inside a kernel) marks the engine poisoned: the next
//! step rebuilds and reallocates the graph before it runs, and the sequence keeps only
//! the positions before the failed step.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use minfer_gguf::GgufFile;
use minfer_graph::trace::logits_top;
use minfer_graph::{
    Backend, BackendCaps, BackendConfig, BackendImpl, BackendScheduler, CParams, CacheCounters,
    ComputeGraph, FaultInjector, FenceError, FusionPass, GraphAllocator, GraphCache, GraphParams,
    KvType,
};
use minfer_models::{HParams, ModelDef};

use crate::checkpoint::CheckpointStore;
use crate::swa::{self, SwaRings};

mod kv_size;
mod options;
mod recurrent;
mod trace;

use kv_size::check_kv_fits;
pub use kv_size::{kv_cache_bytes, kv_cache_bytes_as};
pub use options::{EngineOptions, MAX_DELTA_CHUNK};
use trace::EngineTrace;
pub use trace::{TraceSink, TracedStep, TRACE_LOGITS_TOP};

/// Most tokens of one sequence a speculative verify block runs in one step (a draft of
/// up to `--draft-max` tokens and the token it follows): sliding-window rings keep room
/// for at least this many new rows.
pub const MAX_VERIFY_BLOCK: usize = 17;

/// Errors of loading a model into an engine and running it.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The GGUF file could not be read.
    #[error(transparent)]
    Gguf(#[from] minfer_gguf::GgufError),
    /// The model's architecture or tensors were refused.
    #[error(transparent)]
    Model(#[from] minfer_models::ModelError),
    /// The graph layer refused or failed a step.
    #[error("graph: {0}")]
    Graph(#[from] minfer_graph::GraphError),
    /// A `--backend` / `MINFER_BACKENDS` fence was refused.
    #[error(transparent)]
    Fence(#[from] minfer_graph::FenceError),
    /// A parameter outside its domain, named.
    #[error("invalid {name}: {message}")]
    Param { name: &'static str, message: String },
    /// The request does not fit the context window.
    #[error("{what} needs {needed} positions but the context holds {n_ctx} (raise -c)")]
    ContextOverflow {
        what: &'static str,
        needed: usize,
        n_ctx: usize,
    },
    /// A token id outside the vocabulary.
    #[error("token id {id} is outside the vocabulary of {n_vocab}")]
    BadToken { id: u32, n_vocab: usize },
    /// A `MINFER_*` environment variable holds a value it does not accept.
    #[error(transparent)]
    Env(#[from] minfer_env::EnvError),
    /// Generation (logits) was asked of an encoder, which has no generation head.
    #[error("`{arch}` is an encoder model: it computes embeddings, not text; use `minfer embed` or the embedding routes")]
    Encoder { arch: &'static str },
}

/// One participating backend as reports describe it (`minfer info`, the server's
/// health and props), highest priority first in [`Engine::backend_info`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct BackendInfo {
    /// Registry name (`cpu`, `wgpu`).
    pub name: String,
    /// Whether it executes on a GPU.
    pub gpu: bool,
    /// Its device (adapter, driver, class), where it runs on one.
    pub device: Option<minfer_graph::DeviceInfo>,
}

/// Per-token inputs of one explicit-span step ([`Engine::forward_rows`]): the tokens of
/// one or more sequences, each placed in the KV arena by the caller.
#[derive(Debug, Clone, Copy)]
pub struct TokenRows<'a> {
    /// Token ids.
    pub tokens: &'a [u32],
    /// Each token's index within its own sequence (drives RoPE).
    pub positions: &'a [u32],
    /// The KV arena row each token writes.
    pub cells: &'a [u32],
    /// The KV arena rows `[lo, hi)` each token attends.
    pub spans: &'a [[u32; 2]],
    /// Batch rows whose logits are returned, strictly increasing.
    pub out_rows: &'a [u32],
}

/// Words per K and V row, and the (layer, region) of every layer holding KV rows.
type KvLayout = (usize, usize, Vec<(usize, minfer_graph::KvRegion)>);

/// The default context: the model's own, capped at 4096.
pub const DEFAULT_CTX_CAP: usize = 4096;

/// A loaded model ready to run.
pub struct Engine {
    file: Arc<GgufFile>,
    model: Box<dyn ModelDef>,
    cache: GraphCache,
    scheduler: BackendScheduler,
    fusion: FusionPass,
    n_ctx: usize,
    n_batch: usize,
    load_time: Duration,
    rebuild_every_step: bool,
    explicit_span: bool,
    /// The model has recurrent layers: their state holds exactly positions
    /// `0..written` of the sequence and cannot be rewound ([`Self::keeps`]).
    recurrent: bool,
    /// Virtual KV rows per sequence: a token's recurrent state slot is its KV cell
    /// divided by this (`n_ctx`: one sequence, slot 0).
    seq_rows: usize,
    /// Reused per-step buffers, so a decode step of a reused graph allocates nothing.
    scratch: StepScratch,
    /// Positions `0..filled` of the KV hold the current sequence (plain steps).
    filled: usize,
    /// One past the highest position the current sequence stored since it last started
    /// at 0 (what its sliding-window rings may have overwritten, [`crate::swa`]).
    written: usize,
    /// The sliding-window layers' KV rings.
    swa: SwaRings,
    /// A recurrent model's state checkpoints, per state slot.
    checkpoints: CheckpointStore,
    /// [`EngineOptions::delta_chunk`].
    delta_chunk: usize,
    /// Steps return the final-normed hidden rows instead of logits (embeddings).
    embeddings: bool,
    /// Embedding steps end in the model's rank head (`CParams::rank`): each output row
    /// becomes its scores.
    rank: bool,
    /// Set while a step executes; still set at the next step only if the last one
    /// unwound, whose graph buffers are then not trusted.
    poisoned: bool,
    /// The backends' fault hook (unwind-safety tests).
    fault: FaultInjector,
    /// `CParams` flags implied by the participating backends.
    caps: BackendCaps,
    /// Whether a reused graph is checked against a rebuild (on under debug assertions).
    check_reuse: bool,
    /// Storage formats of the K and V rows.
    kv_types: [KvType; 2],
    /// The per-node trace's sink while one is on.
    trace: Option<EngineTrace>,
    /// The model's identity digest for KV sessions, computed on first use.
    identity: std::sync::OnceLock<[u8; 32]>,
}

/// The row buffers `forward_into` fills for a plain (single-sequence) step.
#[derive(Debug, Default)]
struct StepScratch {
    positions: Vec<u32>,
    spans: Vec<[u32; 2]>,
    out_rows: Vec<u32>,
    state_slots: Vec<u32>,
    /// Zeros: an encoder's token types (every token segment 0, as llama.cpp runs it).
    token_types: Vec<u32>,
}

impl Engine {
    /// Opens `path`, checks the architecture and tensors, registers the weights once
    /// and prepares an empty graph cache.
    pub fn load(path: &Path, opts: &EngineOptions) -> Result<Self, EngineError> {
        let t0 = Instant::now();
        let file = Arc::new(GgufFile::open(path)?);
        Self::from_file(file, opts, t0, &crate::backends::compiled())
    }

    /// An engine over an already opened file (tests build models in memory).
    pub fn from_gguf(file: GgufFile, opts: &EngineOptions) -> Result<Self, EngineError> {
        Self::from_file(
            Arc::new(file),
            opts,
            Instant::now(),
            &crate::backends::compiled(),
        )
    }

    /// An engine over a file shared with other engines (weights stay mapped once).
    pub fn from_arc(file: Arc<GgufFile>, opts: &EngineOptions) -> Result<Self, EngineError> {
        Self::from_file(file, opts, Instant::now(), &crate::backends::compiled())
    }

    /// An engine whose backends come from `factories` instead of this build's table
    /// ([`crate::backends::compiled`]): the fence, the probes and the default selection
    /// apply to them exactly as to the compiled ones (tests plug backends in here).
    pub fn with_factories(
        file: Arc<GgufFile>,
        opts: &EngineOptions,
        factories: &[minfer_graph::BackendFactory],
    ) -> Result<Self, EngineError> {
        Self::from_file(file, opts, Instant::now(), factories)
    }

    fn from_file(
        file: Arc<GgufFile>,
        opts: &EngineOptions,
        t0: Instant,
        factories: &[minfer_graph::BackendFactory],
    ) -> Result<Self, EngineError> {
        opts.check()?;
        let fault = FaultInjector::default();
        let kv_types = [opts.cache_type_k, opts.cache_type_v];
        let cfg = BackendConfig {
            n_threads: opts.n_threads,
            fault: fault.clone(),
            kv_types,
            options: opts.backend_config_options(),
        };
        // A fence probes only the host and the backends it names (`--backend cpu` loads
        // no GPU driver); without one every compiled backend is probed.
        let spec = opts.backend.clone();
        let factories = match &spec {
            Some(spec) => crate::backends::fenced(factories, spec),
            None => factories.to_vec(),
        };
        let registry = minfer_graph::BackendRegistry::from_factories(&factories, &cfg)?;
        let fence = match &spec {
            Some(spec) => Some(registry.parse_fence(spec)?),
            None => None,
        };
        let model = minfer_models::load_model(&file)?;
        let hp = model.hparams();
        let n_ctx = match opts.n_ctx {
            Some(0) => {
                return Err(EngineError::Param {
                    name: "context size (-c)",
                    message: "must be at least 1".into(),
                })
            }
            Some(c) if c > (1 << 24) => {
                return Err(EngineError::Param {
                    name: "context size (-c)",
                    message: format!("{c} exceeds the supported maximum of {}", 1 << 24),
                })
            }
            Some(c) => c,
            None => hp.n_ctx_train.clamp(1, DEFAULT_CTX_CAP),
        };
        for (t, flag) in kv_types.iter().zip(["--cache-type-k", "--cache-type-v"]) {
            if !hp.head_dim.is_multiple_of(t.block()) {
                return Err(EngineError::Param {
                    name: "KV cache type",
                    message: format!(
                        "{flag} {t} needs heads of a multiple of {} values; this model's are {}",
                        t.block(),
                        hp.head_dim
                    ),
                });
            }
        }
        check_kv_fits(hp, n_ctx, kv_types)?;
        // A ring holds a window plus the largest step of one sequence: a prompt chunk or
        // a speculative verify block.
        let ring_step = opts.n_batch.max(MAX_VERIFY_BLOCK);
        let swa = SwaRings::new(model.layer_windows(), n_ctx, ring_step, opts.swa_full);
        let selection = registry.select(fence.as_deref());
        crate::backends::record_notices(&selection.notices);
        let mut backends: Vec<Box<dyn BackendImpl>> = Vec::new();
        for f in factories
            .iter()
            .filter(|f| selection.backends.contains(&f.id))
        {
            let mut b = (f.create)(&cfg).map_err(|reason| FenceError::NotUsable {
                name: f.id.name(),
                reason,
            })?;
            // Every participating backend gets the same file the same way (invariant 3).
            b.register_gguf(&file).map_err(|e| EngineError::Param {
                name: "weights",
                message: format!("{}: {e}", b.name()),
            })?;
            backends.push(b);
        }
        let mut alloc = GraphAllocator::new(backends)?;
        // The selection, not the bare fence: it adds the host CPU to a device fence.
        alloc.set_fence(fence.map(|_| selection.backends.clone()));
        let caps = alloc.backend_caps();
        let mut engine = Engine {
            file,
            model,
            cache: GraphCache::new(alloc),
            scheduler: BackendScheduler::with_options(opts.scheduler),
            fusion: FusionPass::new(),
            n_ctx,
            n_batch: opts.n_batch,
            load_time: t0.elapsed(),
            rebuild_every_step: false,
            explicit_span: false,
            seq_rows: n_ctx.max(1),
            recurrent: false,
            scratch: StepScratch::default(),
            filled: 0,
            written: 0,
            swa,
            checkpoints: CheckpointStore::new(opts.ctx_checkpoints),
            delta_chunk: opts.delta_chunk,
            embeddings: false,
            rank: false,
            poisoned: false,
            fault,
            caps,
            check_reuse: cfg!(debug_assertions),
            kv_types,
            trace: None,
            identity: std::sync::OnceLock::new(),
        };
        engine.recurrent = engine.model.is_recurrent();
        crate::backends::record_in_use(engine.backend_info());
        Ok(engine)
    }

    /// The storage formats of the K and V rows.
    pub fn kv_types(&self) -> [KvType; 2] {
        self.kv_types
    }

    /// Bytes of what the sequences keep: the K and V regions of every attention layer
    /// over the whole context, and a recurrent model's state (every state slot's conv
    /// windows and delta-rule matrices, f32).
    pub fn kv_bytes(&self) -> u64 {
        let hp = self.hparams();
        let per_layer = kv_cache_bytes_as(hp, self.n_ctx, self.kv_types)
            .unwrap_or(u64::MAX)
            .checked_div(hp.n_layer as u64)
            .unwrap_or(0);
        let recurrent = self.model.recurrent_layers();
        // Ringed layers hold their ring's rows, not the context's; recurrent ones none.
        let rows = (0..hp.n_layer)
            .filter(|&il| !recurrent.get(il).copied().unwrap_or(false))
            .map(|il| match self.swa.ring(il) {
                Some(r) => per_layer / self.n_ctx as u64 * r.physical_rows(self.n_ctx) as u64,
                None => per_layer,
            })
            .fold(0u64, u64::saturating_add);
        let state = (self.model.recurrent_state_floats() as u64)
            .saturating_mul(4)
            .saturating_mul(self.state_slots() as u64);
        rows.saturating_add(state)
    }

    /// The positions the recurrent state (or a ring) was last advanced to since the
    /// sequence started at 0 (see [`Self::keeps`]).
    pub(crate) fn written(&self) -> usize {
        self.written
    }

    /// Virtual KV rows per sequence (the context, or a batched engine's slot share).
    pub(crate) fn seq_rows(&self) -> usize {
        self.seq_rows
    }

    /// Layers that keep KV rows (every layer but the recurrent ones).
    pub(crate) fn kv_layers(&self) -> usize {
        self.model
            .recurrent_layers()
            .iter()
            .filter(|&&r| !r)
            .count()
    }

    /// The backend holding the KV regions (one CPU backend today).
    pub fn kv_backend(&self) -> Backend {
        Backend::CPU
    }

    /// The model's identity digest (tensor table and sampled data), computed once.
    pub fn model_digest(&self) -> [u8; 32] {
        *self
            .identity
            .get_or_init(|| crate::digest::model_digest(&self.file))
    }

    /// Creates the KV regions (by installing the decode graph) if no step has run yet.
    pub(crate) fn ensure_kv_regions(&mut self) -> Result<(), EngineError> {
        if self.cache.alloc().kv_region(0).is_some() {
            return Ok(());
        }
        let params = self.params(1, 1)?;
        let graph = self.model.build_graph(&params);
        self.cache
            .install(graph, params, &mut self.scheduler, &self.fusion)?;
        Ok(())
    }

    /// Words per stored K and V row, and every layer's (K, V) pool regions.
    fn kv_layout(&self) -> Result<KvLayout, EngineError> {
        let hp = self.hparams();
        let row = hp.n_head_kv * hp.head_dim;
        let missing = |what: String| EngineError::Param {
            name: "KV",
            message: what,
        };
        let words = |t: KvType| {
            t.row_words(row)
                .ok_or_else(|| missing(format!("rows of {row} as {t}")))
        };
        let (kw, vw) = (words(self.kv_types[0])?, words(self.kv_types[1])?);
        // A recurrent layer's region is its state, not rows: it is not part of the rows.
        let regions = (0..hp.n_layer)
            .map(|l| {
                self.cache
                    .alloc()
                    .kv_region(l)
                    .map(|r| (l, r))
                    .ok_or_else(|| missing(format!("layer {l} has no KV region")))
            })
            .filter(|r| !r.as_ref().is_ok_and(|(_, r)| r.recurrent))
            .collect::<Result<Vec<_>, _>>()?;
        Ok((kw, vw, regions))
    }

    /// Appends rows `[base, base + n)` of every layer's K then V region, as pool words,
    /// to `out` (layer by layer).
    pub(crate) fn read_kv_rows(
        &mut self,
        base: usize,
        n: usize,
        out: &mut Vec<u32>,
    ) -> Result<(), EngineError> {
        self.ensure_kv_regions()?;
        let (kw, vw, regions) = self.kv_layout()?;
        let alloc = self.cache.alloc_mut();
        for (il, r) in regions {
            // A ringed layer's rows sit where its ring maps them ([`crate::swa`]).
            let runs = self.swa.runs(il, base, n);
            for (id, w) in [(r.k, kw), (r.v, vw)] {
                let unreadable = |why: &dyn std::fmt::Display| EngineError::Param {
                    name: "KV",
                    message: format!("rows {base}..{} are not readable: {why}", base + n),
                };
                // Through the backend, so regions on a device are read back from it.
                let b = alloc.backend_mut(r.backend).ok_or_else(|| {
                    unreadable(&format_args!("backend {} is not registered", r.backend))
                })?;
                for &(at, len) in &runs {
                    let buf = b
                        .read_host_window(id, at * w, len * w)
                        .map_err(|e| unreadable(&e))?;
                    out.extend(buf.iter().map(|x| x.to_bits()));
                }
            }
        }
        Ok(())
    }

    /// Writes rows `[base, base + n)` of every layer from `words`, laid out as
    /// [`Self::read_kv_rows`] writes them.
    pub(crate) fn write_kv_rows(
        &mut self,
        base: usize,
        n: usize,
        words: &[u32],
    ) -> Result<(), EngineError> {
        self.ensure_kv_regions()?;
        let (kw, vw, regions) = self.kv_layout()?;
        let alloc = self.cache.alloc_mut();
        let mut at = 0;
        let mut row = Vec::new();
        for (il, r) in regions {
            // In position order, so where a ring maps two positions to one row the later
            // one stays, as it would have after running them.
            let runs = self.swa.runs(il, base, n);
            for (id, w) in [(r.k, kw), (r.v, vw)] {
                let src = words
                    .get(at..at + n * w)
                    .ok_or_else(|| EngineError::Param {
                        name: "KV",
                        message: format!("{} words for {n} rows", words.len()),
                    })?;
                at += n * w;
                let b = alloc
                    .backend_mut(r.backend)
                    .ok_or_else(|| EngineError::Param {
                        name: "KV",
                        message: format!("backend {} is not registered", r.backend),
                    })?;
                let mut from = 0;
                for &(start, len) in &runs {
                    row.clear();
                    row.extend(src[from..from + len * w].iter().map(|&x| f32::from_bits(x)));
                    from += len * w;
                    b.write_host_window(id, start * w, &row)
                        .map_err(|e| EngineError::Param {
                            name: "KV",
                            message: e.to_string(),
                        })?;
                }
            }
        }
        Ok(())
    }

    /// Declares that positions `0..n` of the current sequence hold valid KV rows (a
    /// restored session); the next plain step may start at any position up to `n`.
    pub(crate) fn set_seq_len(&mut self, n: usize) {
        self.filled = n.min(self.n_ctx);
        self.written = self.filled;
    }

    /// [`Self::set_seq_len`] for rows a ring of `saved_step` (0: none) held when saved.
    pub(crate) fn set_restored_len(&mut self, n: usize, saved_step: usize) {
        self.set_seq_len(n);
        self.written = self.swa.restored_written(self.filled, saved_step);
    }

    /// The participating backends' own names (adapter included where they give one),
    /// highest priority first.
    pub fn backend_names(&self) -> Vec<String> {
        let alloc = self.cache.alloc();
        alloc
            .priority_order()
            .into_iter()
            .map(|b| alloc.backend_name(b))
            .collect()
    }

    /// The participating backends whose node outputs the per-node trace cannot read
    /// (`BackendImpl::supports_trace`), by name; empty when a trace can run.
    pub fn untraceable_backends(&self) -> Vec<String> {
        let alloc = self.cache.alloc();
        alloc
            .priority_order()
            .into_iter()
            .filter(|&b| alloc.backend(b).is_some_and(|x| !x.supports_trace()))
            .map(|b| alloc.backend_name(b))
            .collect()
    }

    /// The participating backends and their devices, highest priority first: the one
    /// description every report (command line, health, props) prints.
    pub fn backend_info(&self) -> Vec<BackendInfo> {
        let alloc = self.cache.alloc();
        alloc
            .priority_order()
            .into_iter()
            .filter_map(|b| alloc.backend(b))
            .map(|b| BackendInfo {
                name: b.id().name(),
                gpu: b.is_gpu(),
                device: b.device_info(),
            })
            .collect()
    }

    /// The `CParams` flags the participating backends imply (all off on the CPU).
    pub fn backend_caps(&self) -> BackendCaps {
        self.caps
    }

    /// The opened GGUF file.
    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The model's hyperparameters.
    pub fn hparams(&self) -> &HParams {
        self.model.hparams()
    }

    /// The model's architecture name.
    pub fn arch(&self) -> &'static str {
        self.model.arch()
    }

    /// Context length in positions.
    pub fn n_ctx(&self) -> usize {
        self.n_ctx
    }

    /// Largest prefill chunk, in tokens.
    pub fn n_batch(&self) -> usize {
        self.n_batch
    }

    /// Vocabulary size (width of one logits row).
    pub fn n_vocab(&self) -> usize {
        self.model.hparams().n_vocab
    }

    /// Time spent opening the file and preparing the engine.
    pub fn load_time(&self) -> Duration {
        self.load_time
    }

    /// Graph builds and reuses so far.
    pub fn counters(&self) -> CacheCounters {
        self.cache.counters()
    }

    /// Forces a fresh graph at every step (the reference side of the reuse identity).
    pub fn set_rebuild_every_step(&mut self, on: bool) {
        self.rebuild_every_step = on;
    }

    /// Builds graphs with the `cells` and `span` inputs, so a step may hold tokens of
    /// several sequences placed anywhere in the KV arena ([`Self::forward_rows`]). Plain
    /// [`Self::forward`] keeps working: it fills cells and spans of one sequence at row 0.
    pub fn set_explicit_span(&mut self, on: bool) {
        self.explicit_span = on;
    }

    /// Sizes the sliding-window rings for sequences of `seq_rows` virtual rows each
    /// (slots sharing the arena, [`crate::MultiEngine`]); before the first step only,
    /// since the rings' rows are allocated then.
    pub(crate) fn set_seq_rows(&mut self, seq_rows: usize) {
        self.swa = self.swa.resized(seq_rows);
        self.seq_rows = seq_rows.max(1);
    }

    /// Per-op wall time since the last call, with `MINFER_PROFILE=1` (empty otherwise).
    pub fn take_profile(&self) -> Vec<(&'static str, Duration, usize)> {
        self.scheduler.take_profile()
    }

    /// Turns off (or back on) the structural check of every reused graph against a
    /// rebuild that debug assertions enable; it builds a graph per step, so a test that
    /// counts allocations of the release path turns it off. No effect without debug
    /// assertions.
    #[doc(hidden)]
    pub fn set_check_reuse(&mut self, on: bool) {
        self.check_reuse = on && cfg!(debug_assertions);
    }

    /// Starts a new, unrelated sequence: the next plain step must start at position 0.
    /// The graph, the KV regions and every buffer stay; nothing is allocated or cleared,
    /// since no later step can read a row the new sequence has not written. The old
    /// sequence's state checkpoints go.
    pub fn reset(&mut self) {
        self.filled = 0;
        self.checkpoints.clear(0);
    }

    /// Positions of the current sequence held in the KV (a plain step may start at any
    /// position up to this one).
    pub fn seq_len(&self) -> usize {
        self.filled
    }

    /// Buffers ever created in the CPU backend's pool (memory tests: it must stay flat
    /// across resets and repeated steps).
    pub fn pool_len(&self) -> usize {
        self.cache.alloc().pool_len(Backend::CPU).unwrap_or(0)
    }

    /// Elements held by the CPU backend's pool: its memory in f32s, KV included.
    pub fn pool_elems(&self) -> usize {
        self.cache.alloc().pool_elems(Backend::CPU).unwrap_or(0)
    }

    /// Arms a panic inside the kernel of the `nth` node executed from now on (1-based),
    /// raised on a thread-pool thread. For unwind-safety tests only.
    #[doc(hidden)]
    pub fn inject_kernel_panic(&self, nth: usize) {
        self.fault.panic_at_node(nth);
    }

    /// The parameters of a step of `nt` tokens with `n_out` logits rows.
    pub fn params(&self, nt: usize, n_out: usize) -> Result<GraphParams, EngineError> {
        let mut cparams = CParams {
            n_ctx: self.n_ctx,
            flash_attn: false,
            gpu: false,
            fuse_qkv: false,
            fuse_ffn: false,
            explicit_span: self.explicit_span,
            ring: self.swa.params(),
            embeddings: self.embeddings,
            rank: self.rank,
            state_slots: (self.n_ctx / self.seq_rows).max(1),
            delta_chunk: self.delta_chunk,
        };
        self.caps.apply(&mut cparams);
        // The one validated constructor: the graph type and weights version follow from
        // the counts, and counts the graph cannot hold are refused here, not in a kernel.
        Ok(minfer_models::params::graph_params(nt, n_out, cparams)?)
    }

    /// Turns the per-node trace on (`Some(sink)`: every later step's captured nodes, at
    /// most `max_values` sampled values each, go to `sink`) or off (`None`). The host
    /// backend's buffers are read in place, a device backend's are staged and read once
    /// per split; a step that runs a node on a backend that can do neither (see
    /// [`Self::untraceable_backends`]) fails while the trace is on, naming the backend.
    pub fn set_trace(&mut self, sink: Option<TraceSink>, max_values: usize) {
        self.scheduler
            .set_trace(sink.is_some().then_some(max_values));
        self.trace = sink.map(|sink| EngineTrace {
            sink,
            last_uid: None,
        });
    }

    /// The `general.name` the graph exports carry (the architecture when unnamed).
    pub fn model_name(&self) -> &str {
        self.file
            .get_str("general.name")
            .unwrap_or(self.model.arch())
    }

    /// The graph a live step of this shape runs (after assignment and fusion), for export.
    pub fn preview_graph(&mut self, nt: usize, n_out: usize) -> Result<ComputeGraph, EngineError> {
        let params = self.params(nt, n_out)?;
        let mut graph = self.model.build_graph(&params);
        let mut scheduler = BackendScheduler::new();
        scheduler.assign_backends(&mut graph, self.cache.alloc());
        self.fusion.run(&mut graph, self.cache.alloc());
        Ok(graph)
    }

    /// `forward_graph_cached`: runs `tokens` at positions `pos0..pos0+nt` and returns the
    /// logits of the last `n_out` tokens, row by row (`n_out * n_vocab` floats).
    pub fn forward(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        n_out: usize,
    ) -> Result<Vec<f32>, EngineError> {
        let mut out = Vec::new();
        self.forward_into(tokens, pos0, n_out, &mut out)?;
        Ok(out)
    }

    /// [`Engine::forward`] into a caller-owned buffer: once the graph is built and `out`
    /// has grown to size, a decode step allocates nothing.
    pub fn forward_into(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        n_out: usize,
        out: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let nt = tokens.len();
        self.forward_span(tokens, pos0, nt.saturating_sub(n_out)..nt, out)
    }

    /// [`Engine::forward_into`] returning the rows of the tokens `rows` (a non-empty
    /// range of the step's), which need not be the last ones.
    fn forward_span(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        rows: Range<usize>,
        out: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        self.check_not_encoder()?;
        let nt = tokens.len();
        if nt == 0 || rows.is_empty() || rows.end > nt {
            return Err(EngineError::Param {
                name: "batch",
                message: format!("{nt} tokens with output rows {}..{}", rows.start, rows.end),
            });
        }
        let end = pos0.saturating_add(nt);
        if end > self.n_ctx {
            return Err(EngineError::ContextOverflow {
                what: "this step",
                needed: end,
                n_ctx: self.n_ctx,
            });
        }
        if pos0 > self.filled {
            return Err(EngineError::Param {
                name: "pos0",
                message: format!(
                    "the sequence holds {} positions, a step cannot start at {pos0}",
                    self.filled
                ),
            });
        }
        swa::check_step(&self.swa, pos0, nt, self.written).map_err(|message| {
            EngineError::Param {
                name: "KV",
                message,
            }
        })?;
        if self.recurrent && !self.recurrent_step_ok(0, pos0, self.written) {
            return Err(Self::recurrent_step_error(pos0, self.written));
        }
        let n_vocab = self.n_vocab();
        if let Some(&id) = tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::BadToken { id, n_vocab });
        }
        if self.recurrent && self.prepare_recurrent_step(0, pos0, self.written)? {
            // The state now holds exactly `0..pos0`, as the restored checkpoint did.
            self.written = pos0;
        }
        // Rows from `pos0` on are rewritten by this step: until it succeeds (an error or
        // an unwind included) the sequence holds only the rows before it.
        self.filled = pos0;
        let mut sc = std::mem::take(&mut self.scratch);
        sc.positions.clear();
        sc.positions.extend((pos0..pos0 + nt).map(|p| p as u32));
        sc.spans.clear();
        sc.spans.extend(sc.positions.iter().map(|&p| [0, p + 1]));
        sc.out_rows.clear();
        sc.out_rows.extend(rows.start as u32..rows.end as u32);
        if self.recurrent {
            // The state advances as the step runs: from here on, an error or an unwind
            // included, it no longer holds exactly `0..pos0` (a checkpoint still does).
            self.written = end;
        }
        let r = self.run(
            &TokenRows {
                tokens,
                positions: &sc.positions,
                cells: &sc.positions,
                spans: &sc.spans,
                out_rows: &sc.out_rows,
            },
            out,
        );
        self.scratch = sc;
        // Rows from `pos0` on may be written even by a step that failed.
        self.written = swa::written_after(pos0, end, self.written);
        if r.is_ok() {
            self.filled = end;
        }
        r
    }

    /// Runs `tokens` at positions `pos0..` of the current sequence, as [`Self::forward`]
    /// does, and returns the final-normed hidden states of the tokens `rows` (a range of
    /// the step's, `n_embd` values each): the rows that embeddings pool. Only those rows
    /// go through the output end of the graph.
    pub fn forward_hidden(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        self.embeddings = true;
        let mut out = Vec::new();
        let r = self.forward_span(tokens, pos0, rows, &mut out);
        self.embeddings = false;
        r.map(|()| out)
    }

    /// [`Self::forward_rows`] returning the hidden rows of `rows.out_rows` (`n_embd`
    /// wide) instead of their logits: embeddings over explicit KV rows.
    pub fn forward_rows_hidden(&mut self, rows: &TokenRows) -> Result<Vec<f32>, EngineError> {
        self.embeddings = true;
        let r = self.forward_rows(rows);
        self.embeddings = false;
        r
    }

    /// Values per row of the model's rank (classifier) head, or `None` when it has none
    /// ([`minfer_models::ModelDef::rank_width`]).
    pub fn rank_width(&self) -> Option<usize> {
        self.model.rank_width()
    }

    /// [`Self::forward_hidden`] through the model's rank head: the scores of the tokens
    /// `rows` ([`Self::rank_width`] values each; rank pooling reads the first token's, and
    /// the head runs on no other row). A model without a head is refused by name.
    pub fn forward_scores(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        rows: Range<usize>,
    ) -> Result<Vec<f32>, EngineError> {
        self.require_rank_head()?;
        self.rank = true;
        let r = self.forward_hidden(tokens, pos0, rows);
        self.rank = false;
        r
    }

    /// [`Self::forward_rows_hidden`] through the model's rank head, as
    /// [`Self::forward_scores`].
    pub fn forward_rows_scores(&mut self, rows: &TokenRows) -> Result<Vec<f32>, EngineError> {
        self.require_rank_head()?;
        self.rank = true;
        let r = self.forward_rows_hidden(rows);
        self.rank = false;
        r
    }

    /// [`Self::rank_width`], or an error naming what a model without a classifier head
    /// lacks for rank pooling.
    pub fn require_rank_head(&self) -> Result<usize, EngineError> {
        self.rank_width().ok_or_else(|| EngineError::Param {
            name: "pooling",
            message: format!(
                "rank needs a classifier head (`cls.output.weight` or `cls.weight`), which this `{}` model does not have",
                self.model.arch()
            ),
        })
    }

    /// Whether the model is an encoder (BERT): embeddings only, a text in one step.
    pub fn is_encoder(&self) -> bool {
        self.model.is_encoder()
    }

    /// Refuses a logits step on an encoder by name (embedding steps pass).
    fn check_not_encoder(&self) -> Result<(), EngineError> {
        if self.model.is_encoder() && !self.embeddings {
            return Err(EngineError::Encoder {
                arch: self.model.arch(),
            });
        }
        Ok(())
    }

    /// Whether the current sequence can go on from position `kept` (a reused prefix)
    /// as it stands: always, unless sliding-window rings dropped rows that position
    /// needs ([`crate::swa`]) or recurrent state holds other positions; then the caller
    /// goes on from [`Self::resume_point`].
    pub fn keeps(&self, kept: usize) -> bool {
        if self.recurrent {
            return Self::recurrent_continues(kept, self.written);
        }
        kept >= self.written || self.swa.keeps(kept, self.written)
    }

    /// The sliding-window layers' KV rings.
    pub fn swa(&self) -> &SwaRings {
        &self.swa
    }

    /// Runs one explicit-span step (see [`Self::set_explicit_span`], which must be on)
    /// and returns the logits of `rows.out_rows`, row by row. Every row is checked
    /// against the vocabulary and the KV arena before anything runs.
    pub fn forward_rows(&mut self, rows: &TokenRows) -> Result<Vec<f32>, EngineError> {
        self.check_not_encoder()?;
        let bad = |message: String| {
            Err(EngineError::Param {
                name: "batch",
                message,
            })
        };
        if !self.explicit_span {
            return bad("rows with explicit KV cells need set_explicit_span(true)".into());
        }
        let nt = rows.tokens.len();
        if nt == 0 || rows.out_rows.is_empty() {
            return bad(format!(
                "{nt} tokens with {} output rows",
                rows.out_rows.len()
            ));
        }
        if [rows.positions.len(), rows.cells.len(), rows.spans.len()] != [nt; 3] {
            return bad(format!(
                "{nt} tokens but {} positions, {} cells and {} spans",
                rows.positions.len(),
                rows.cells.len(),
                rows.spans.len()
            ));
        }
        if rows.out_rows.windows(2).any(|w| w[0] >= w[1])
            || rows.out_rows.iter().any(|&r| r as usize >= nt)
        {
            return bad(format!(
                "output rows {:?} are not increasing rows of {nt} tokens",
                rows.out_rows
            ));
        }
        let n_vocab = self.n_vocab();
        if let Some(&id) = rows.tokens.iter().find(|&&t| t as usize >= n_vocab) {
            return Err(EngineError::BadToken { id, n_vocab });
        }
        let n_ctx = self.n_ctx;
        for t in 0..nt {
            let (c, [lo, hi]) = (rows.cells[t] as usize, rows.spans[t]);
            if c >= n_ctx || lo >= hi || hi as usize > n_ctx || rows.positions[t] as usize >= n_ctx
            {
                return bad(format!(
                    "token {t}: cell {c}, span [{lo}, {hi}), position {} do not fit a KV arena of {n_ctx} rows",
                    rows.positions[t]
                ));
            }
        }
        let mut out = Vec::new();
        self.run(rows, &mut out)?;
        Ok(out)
    }

    /// Installs (or reuses) the graph for `rows`, fills its inputs, runs it and reads
    /// the logits; the caller has validated `rows`.
    fn run(&mut self, rows: &TokenRows, out: &mut Vec<f32>) -> Result<(), EngineError> {
        let (nt, n_out) = (rows.tokens.len(), rows.out_rows.len());
        let params = self.params(nt, n_out)?;
        if std::mem::replace(&mut self.poisoned, true) {
            // The last step unwound mid-execution: rebuild before trusting its buffers.
            self.cache.forget_graph();
        }
        let r = self.run_graph(rows, params, out);
        self.poisoned = false;
        r
    }

    /// The body of [`Self::run`]: an unwind out of here leaves the engine poisoned.
    fn run_graph(
        &mut self,
        rows: &TokenRows,
        params: GraphParams,
        out: &mut Vec<f32>,
    ) -> Result<(), EngineError> {
        let n_out = rows.out_rows.len();
        let nt = rows.tokens.len();
        if self.rebuild_every_step || !self.cache.try_reuse(&params) {
            let graph = self.model.build_graph(&params);
            self.cache
                .install(graph, params, &mut self.scheduler, &self.fusion)?;
        } else if self.check_reuse {
            self.check_reused_graph(&params);
        }
        let (graph, alloc) = self.cache.current().ok_or_else(|| EngineError::Param {
            name: "graph",
            message: "no graph installed".into(),
        })?;
        alloc.fill_input_u32(graph, minfer_models::INPUT_TOKEN_IDS, rows.tokens)?;
        alloc.fill_input_u32(graph, minfer_models::INPUT_POSITIONS, rows.positions)?;
        if n_out < nt {
            alloc.fill_input_u32(graph, minfer_models::INPUT_TAIL_IDS, rows.out_rows)?;
        }
        if self.explicit_span {
            let spans: &[u32] = rows.spans.as_flattened();
            alloc.fill_input_u32(graph, minfer_models::INPUT_SPAN, spans)?;
            alloc.fill_input_u32(graph, minfer_models::INPUT_CELLS, rows.cells)?;
        }
        if graph
            .input_by_name(minfer_models::INPUT_STATE_SLOTS)
            .is_some()
        {
            // A recurrent layer's state slot is its sequence's: the arena range its cells
            // fall in (data, like the cells themselves).
            let slots = &mut self.scratch.state_slots;
            slots.clear();
            slots.extend(rows.cells.iter().map(|&c| c / self.seq_rows as u32));
            alloc.fill_input_u32(graph, minfer_models::INPUT_STATE_SLOTS, slots)?;
        }
        if graph
            .input_by_name(minfer_models::bert::INPUT_TOKEN_TYPES)
            .is_some()
        {
            let types = &mut self.scratch.token_types;
            types.clear();
            types.resize(nt, 0);
            alloc.fill_input_u32(graph, minfer_models::bert::INPUT_TOKEN_TYPES, types)?;
        }
        self.scheduler.execute(graph, alloc)?;
        if !alloc.read_into(graph.outputs[0], out) {
            return Err(EngineError::Param {
                name: "logits",
                message: "output buffer is not readable".into(),
            });
        }
        if let Some(t) = self.trace.as_mut() {
            let kind = if nt > 1 { "prefill" } else { "decode" };
            let new_graph = t.last_uid != Some(graph.uid);
            t.last_uid = Some(graph.uid);
            let name = self
                .file
                .get_str("general.name")
                .unwrap_or(self.model.arch());
            let n_vocab = out.len() / n_out.max(1);
            (t.sink)(TracedStep {
                kind,
                graph_uid: graph.uid,
                graph: new_graph.then(|| minfer_graph::export_graph_json(graph, name, kind)),
                nodes: self.scheduler.take_trace(),
                logits_top: logits_top(&out[out.len() - n_vocab..], TRACE_LOGITS_TOP),
            });
        }
        Ok(())
    }

    /// Invariant 2, checked under debug assertions: the graph reused for `params` is
    /// structurally the graph a rebuild gives (after assignment and fusion). A mismatch
    /// is an internal bug, so it panics, naming the params.
    fn check_reused_graph(&self, params: &GraphParams) {
        #[cfg(debug_assertions)]
        {
            let mut fresh = self.model.build_graph(params);
            let mut scheduler = BackendScheduler::new();
            scheduler.assign_backends(&mut fresh, self.cache.alloc());
            self.fusion.run(&mut fresh, self.cache.alloc());
            let same = self
                .cache
                .graph()
                .is_some_and(|g| GraphCache::verify_structural(g, &fresh));
            assert!(
                same,
                "graph reuse identity broken: the cached graph for {params:?} differs from a rebuild"
            );
        }
        #[cfg(not(debug_assertions))]
        let _ = params;
    }

    /// The position after a prompt of `tokens` from `pos0`, refused when it overflows the
    /// context.
    pub(crate) fn prompt_end(&self, tokens: &[u32], pos0: usize) -> Result<usize, EngineError> {
        let end = pos0.saturating_add(tokens.len());
        if end > self.n_ctx {
            return Err(EngineError::ContextOverflow {
                what: "the prompt",
                needed: end,
                n_ctx: self.n_ctx,
            });
        }
        Ok(end)
    }

    /// Prefills `tokens` from position `pos0` in chunks of at most `n_batch` and returns
    /// the logits of the last token.
    pub fn prefill(&mut self, tokens: &[u32], pos0: usize) -> Result<Vec<f32>, EngineError> {
        self.prompt_end(tokens, pos0)?;
        let mut logits = Vec::new();
        let mut pos = pos0;
        for chunk in tokens.chunks(self.n_batch) {
            logits = self.forward(chunk, pos, 1)?;
            pos += chunk.len();
        }
        Ok(logits)
    }
}

#[cfg(test)]
mod tests;
