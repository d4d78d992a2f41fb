//! Several independent sequences ("slots") over one model: the server's engine.
//!
//! API CONTRACT (the server is written against it). Each slot owns a fixed share of the
//! context; a slot never observes another slot's KV. `step` runs one step for several
//! slots at once.
//!
//! One engine (one graph cache, one CPU backend and thread pool) serves every slot. The
//! KV region is one arena of `n_slots * slot_ctx` rows; slot `s` owns rows
//! `[s * slot_ctx, (s + 1) * slot_ctx)`. The graph is built with explicit spans
//! (invariant 1: KV rows are data): a token of slot `s` at position `p` gets position `p`
//! (RoPE), writes arena row `s * slot_ctx + p` (`cells`) and attends rows
//! `[s * slot_ctx, s * slot_ctx + p + 1)` (`span`).
//!
//! Batching: with batching on, a step's entries run together in one graph execution, so
//! each weight row is read once per step for all of them (the quantized matmul kernels
//! take up to four tokens per pass over a row). With it off, each entry runs alone, one
//! execution per entry. The kernels compute every token's row independently of the other
//! rows in the execution, so both modes give bitwise-identical logits; they differ only in
//! speed. Batching is on by default: `examples/batch_bench.rs` (2 threads, the default
//! Qwen2.5-Coder-0.5B Q4_K_M model, 2-core machine) measured about 1.8x the serial
//! aggregate decode speed with 2 and with 4 streams, and one stream runs the same single
//! execution either way. `EngineOptions::batching` (`MINFER_BATCH=0|1`
//! on the command line) chooses, fixed when the engine is built.

use std::path::Path;
use std::sync::Arc;

use minfer_gguf::GgufFile;

use crate::checkpoint::SlotSnapshot;
use crate::embed::Pooling;
use crate::engine::{Engine, EngineError, EngineOptions, TokenRows};

/// One slot's work in a step: `tokens` at positions `pos0..pos0 + tokens.len()` of
/// `slot`, returning the logits of the last `n_out` tokens.
#[derive(Debug, Clone)]
pub struct SeqStep {
    /// Slot index in `0..n_slots`.
    pub slot: usize,
    /// Tokens to run.
    pub tokens: Vec<u32>,
    /// Position of the first token within the slot's sequence.
    pub pos0: usize,
    /// Logits rows wanted (the last `n_out` tokens).
    pub n_out: usize,
}

/// One model serving `n_slots` sequences, each with `n_ctx / n_slots` positions.
pub struct MultiEngine {
    engine: Engine,
    slot_ctx: usize,
    /// Positions of each slot whose KV rows hold the slot's current sequence.
    filled: Vec<usize>,
    /// Each slot's `written` mark for its sliding-window rings ([`crate::swa`]).
    written: Vec<usize>,
    /// Where each slot's running prompt ends, while its checkpoints are still to be
    /// taken ([`Self::checkpoint_prompt`]).
    prompt_end: Vec<Option<usize>>,
    batching: bool,
    n_batch: usize,
}

/// Where a logits row of one execution goes: entry and row within that entry's output.
type Dest = Option<(usize, usize)>;

/// The inputs of one graph execution being assembled.
#[derive(Default)]
struct Exec {
    tokens: Vec<u32>,
    positions: Vec<u32>,
    cells: Vec<u32>,
    spans: Vec<[u32; 2]>,
    out_rows: Vec<u32>,
    dests: Vec<Dest>,
    /// (slot, position) state checkpoints to take once this execution ran.
    checkpoints: Vec<(usize, usize)>,
}

impl Exec {
    fn len(&self) -> usize {
        self.tokens.len()
    }
}

impl MultiEngine {
    /// Loads `path` once and prepares `n_slots` empty slots sharing `opts.n_ctx`
    /// (the default context when `None`).
    pub fn load(path: &Path, opts: &EngineOptions, n_slots: usize) -> Result<Self, EngineError> {
        let file = Arc::new(GgufFile::open(path)?);
        Self::from_shared(file, opts, n_slots)
    }

    /// Like `load`, over an opened file.
    pub fn from_shared(
        file: Arc<GgufFile>,
        opts: &EngineOptions,
        n_slots: usize,
    ) -> Result<Self, EngineError> {
        if n_slots == 0 || n_slots > 256 {
            return Err(EngineError::Param {
                name: "slots",
                message: format!("{n_slots} is not in 1..=256"),
            });
        }
        let batching = opts.batching;
        let mut engine = Engine::from_arc(file, opts)?;
        let slot_ctx = engine.n_ctx() / n_slots;
        if slot_ctx == 0 {
            return Err(EngineError::Param {
                name: "slots",
                message: format!("{n_slots} slots do not fit a context of {}", engine.n_ctx()),
            });
        }
        engine.set_explicit_span(true);
        // Each slot is one sequence of `slot_ctx` virtual rows; its rings are its own.
        engine.set_seq_rows(slot_ctx);
        Ok(MultiEngine {
            engine,
            slot_ctx,
            filled: vec![0; n_slots],
            written: vec![0; n_slots],
            prompt_end: vec![None; n_slots],
            batching,
            n_batch: opts.n_batch,
        })
    }

    /// Number of slots.
    pub fn n_slots(&self) -> usize {
        self.filled.len()
    }

    /// Positions each slot holds.
    pub fn slot_ctx(&self) -> usize {
        self.slot_ctx
    }

    /// Vocabulary size (width of one logits row).
    pub fn n_vocab(&self) -> usize {
        self.engine.n_vocab()
    }

    /// The model file (tokenizer, metadata).
    pub fn file(&self) -> &GgufFile {
        self.engine.file()
    }

    /// Whether a step's entries run in one graph execution (see the module docs).
    pub fn batching(&self) -> bool {
        self.batching
    }

    /// Turns batching on or off; results are the same either way.
    pub fn set_batching(&mut self, on: bool) {
        self.batching = on;
    }

    /// Positions of `slot`'s current sequence held in its KV rows (a step may start at
    /// any position up to this one).
    pub fn slot_len(&self, slot: usize) -> Result<usize, EngineError> {
        self.check_slot(slot)?;
        Ok(self.filled[slot])
    }

    /// The shared engine (graph counters, hyperparameters).
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The shared engine, mutably (KV sessions read and write a slot's rows through it).
    pub(crate) fn engine_mut(&mut self) -> &mut Engine {
        &mut self.engine
    }

    /// Declares that positions `0..n` of `slot` hold valid KV rows (a restored session).
    pub(crate) fn set_slot_len(&mut self, slot: usize, n: usize) {
        self.set_restored_len(slot, n, 0);
    }

    /// [`Self::set_slot_len`] for rows a ring of `saved_step` (0: none) held when saved.
    pub(crate) fn set_restored_len(&mut self, slot: usize, n: usize, saved_step: usize) {
        if let Some(f) = self.filled.get_mut(slot) {
            *f = n.min(self.slot_ctx);
            self.written[slot] = self.engine.swa().restored_written(*f, saved_step);
        }
    }

    /// Whether `slot` can go on from position `kept` (a reused prefix) as it stands:
    /// always, unless its sliding-window rings dropped rows that position needs
    /// ([`crate::swa`]) or its recurrent state holds other positions; then the caller
    /// goes on from [`Self::resume_point`].
    pub fn keeps(&self, slot: usize, kept: usize) -> bool {
        let written = self.written.get(slot).copied().unwrap_or(0);
        if self.engine.is_recurrent() {
            return Engine::recurrent_continues(kept, written);
        }
        kept >= written || self.engine.swa().keeps(kept, written)
    }

    /// The largest position at most `kept` from which `slot` can go on: `kept` when
    /// [`Self::keeps`] says so, else the slot's last state checkpoint inside it (a
    /// recurrent model), else 0. A step from a checkpoint restores it first.
    pub fn resume_point(&self, slot: usize, kept: usize) -> usize {
        if self.keeps(slot, kept) {
            return kept;
        }
        if !self.engine.is_recurrent() || slot >= self.n_slots() {
            return 0;
        }
        self.engine
            .recurrent_resume(slot, kept, self.written[slot], self.filled[slot])
    }

    /// Declares that `slot` runs a prompt ending at position `end`: the steps that run
    /// its tokens stop at its checkpoint marks ([`crate::checkpoint`]) and copy the
    /// slot's state there. Nothing for a model without recurrent layers or with
    /// checkpoints off.
    pub fn checkpoint_prompt(&mut self, slot: usize, end: usize) {
        if let Some(e) = self.prompt_end.get_mut(slot) {
            *e = self.engine.checkpointing().then_some(end);
        }
    }

    /// Checkpoints taken and restored, and what they hold now (every slot).
    pub fn checkpoint_stats(&self) -> crate::checkpoint::CheckpointStats {
        self.engine.checkpoint_stats()
    }

    /// Arms a panic inside the kernel of the `nth` node executed from now on (1-based),
    /// raised on a thread-pool thread. For unwind-safety tests only.
    #[doc(hidden)]
    pub fn inject_kernel_panic(&self, nth: usize) {
        self.engine.inject_kernel_panic(nth);
    }

    /// A copy of `slot`'s recurrent state, which holds the positions the slot has run,
    /// for [`Self::restore_slot`]: a speculative block's rollback, since recurrent state
    /// cannot be taken back by moving a position. `None` for a model without recurrent
    /// layers (its KV rows past the accepted tokens are simply never read).
    pub fn snapshot_slot(&mut self, slot: usize) -> Result<Option<SlotSnapshot>, EngineError> {
        self.check_slot(slot)?;
        if !self.engine.is_recurrent() {
            return Ok(None);
        }
        Ok(Some(SlotSnapshot {
            slot,
            state: self.engine.read_state_slot(slot)?,
            written: self.written[slot],
            filled: self.filled[slot],
        }))
    }

    /// Puts `snap`'s state back into its slot, which then holds the positions it held
    /// when the snapshot was taken (`0..written`); its checkpoints past them go. The
    /// kept part of a rejected block is then run again from there by the next step.
    pub fn restore_slot(&mut self, snap: &SlotSnapshot) -> Result<(), EngineError> {
        let slot = snap.slot;
        self.check_slot(slot)?;
        // Until the state is back the slot holds nothing it could go on from.
        self.filled[slot] = 0;
        self.engine
            .rewind_state_slot(slot, &snap.state, snap.written)?;
        self.written[slot] = snap.written;
        self.filled[slot] = snap.filled.min(snap.written);
        Ok(())
    }

    /// Forgets a slot's KV contents; allocates nothing (the slot's rows are reused).
    pub fn reset_slot(&mut self, slot: usize) -> Result<(), EngineError> {
        self.check_slot(slot)?;
        // Its rows are only ever read inside spans ending at positions written since.
        self.filled[slot] = 0;
        self.prompt_end[slot] = None;
        self.engine.clear_checkpoints(slot);
        Ok(())
    }

    /// Makes `dst` hold the first `n` positions of `src`'s sequence by copying their KV
    /// rows (KV positions are data: a forked sequence is the same rows in another slot's
    /// share of the arena). `n` choices of one prompt prefill it once and fork it this
    /// way. On failure `dst` holds no positions; `src` is never changed.
    pub fn copy_prefix(&mut self, src: usize, dst: usize, n: usize) -> Result<(), EngineError> {
        self.check_slot(src)?;
        self.check_slot(dst)?;
        if n > self.filled[src] {
            return Err(EngineError::Param {
                name: "copy_prefix",
                message: format!(
                    "slot {src} holds {} positions, {n} cannot be copied",
                    self.filled[src]
                ),
            });
        }
        // Recurrent state holds exactly the positions the slot ran: a fork copies it
        // whole, so it can only take all of them.
        let recurrent = self.engine.is_recurrent();
        if recurrent && !Engine::recurrent_continues(n, self.written[src]) {
            return Err(EngineError::Param {
                name: "copy_prefix",
                message: format!(
                    "slot {src}'s recurrent state holds {} positions; a fork takes all of them, not {n}",
                    self.written[src]
                ),
            });
        }
        if src == dst {
            self.filled[dst] = n;
            return Ok(());
        }
        // The rows are rewritten from 0: until the copy succeeds dst holds none.
        self.filled[dst] = 0;
        // A ring's rows of `src` go with what `src` overwrote in them.
        self.written[dst] = self.written[src].max(n);
        let mut words = Vec::new();
        let ctx = self.slot_ctx;
        self.engine.read_kv_rows(src * ctx, n, &mut words)?;
        self.engine.write_kv_rows(dst * ctx, n, &words)?;
        if recurrent && n > 0 {
            self.engine.copy_state_slot(src, dst, n)?;
        }
        self.filled[dst] = n;
        Ok(())
    }

    /// Whether KV rows of this engine may be exported and imported by position
    /// ([`Self::export_rows`]): not when a sliding-window layer keeps a ring, whose
    /// rows of a position are overwritten once the window moves on, nor for a model
    /// with recurrent layers, whose state is not rows by position.
    pub fn rows_portable(&self) -> bool {
        // A recurrent layer's state is one per slot, not rows by position: rows copied
        // without it would pair another sequence's state with these tokens.
        !self.engine.swa().active() && !self.engine.is_recurrent()
    }

    /// The KV rows of positions `from..from + n` of `slot`, exactly as stored (per
    /// layer: its K rows, then its V rows). Positions past what the slot holds, or an
    /// engine whose rows are not portable, are refused by name.
    pub fn export_rows(
        &mut self,
        slot: usize,
        from: usize,
        n: usize,
    ) -> Result<Vec<u32>, EngineError> {
        self.check_slot(slot)?;
        self.check_portable()?;
        if from + n > self.filled[slot] {
            return Err(EngineError::Param {
                name: "export_rows",
                message: format!(
                    "slot {slot} holds {} positions, {from}..{} cannot be read",
                    self.filled[slot],
                    from + n
                ),
            });
        }
        let mut words = Vec::new();
        self.engine
            .read_kv_rows(slot * self.slot_ctx + from, n, &mut words)?;
        Ok(words)
    }

    /// Writes `words` (as [`Self::export_rows`] gave them for `n` positions) at
    /// positions `at..at + n` of `slot`, which then holds `at + n` positions: the rows
    /// before `at` stay, anything after is gone. `at` past what the slot holds, a range
    /// past the slot, or too few words, is refused; a refused range changes nothing, and
    /// a write that fails leaves the slot holding the positions before `at`.
    pub fn import_rows(
        &mut self,
        slot: usize,
        at: usize,
        n: usize,
        words: &[u32],
    ) -> Result<(), EngineError> {
        self.check_slot(slot)?;
        self.check_portable()?;
        if at > self.filled[slot] || at + n > self.slot_ctx {
            return Err(EngineError::Param {
                name: "import_rows",
                message: format!(
                    "slot {slot} holds {} of {} positions, {at}..{} cannot be written",
                    self.filled[slot],
                    self.slot_ctx,
                    at + n
                ),
            });
        }
        self.filled[slot] = at;
        self.engine
            .write_kv_rows(slot * self.slot_ctx + at, n, words)?;
        self.written[slot] = crate::swa::written_after(at, at + n, self.written[slot]);
        self.filled[slot] = at + n;
        Ok(())
    }

    fn check_portable(&self) -> Result<(), EngineError> {
        if self.rows_portable() {
            return Ok(());
        }
        Err(EngineError::Param {
            name: "KV",
            message: "rows of sliding-window rings cannot be moved by position (use --swa-full)"
                .into(),
        })
    }

    fn check_slot(&self, slot: usize) -> Result<(), EngineError> {
        let n = self.n_slots();
        if slot >= n {
            return Err(EngineError::Param {
                name: "slot",
                message: format!("{slot} is not in 0..{n}"),
            });
        }
        Ok(())
    }

    /// Refuses a step that names a slot twice, leaves a gap in a slot's sequence, runs
    /// past a slot's share of the context or holds an id outside the vocabulary.
    fn validate(&self, batch: &[SeqStep]) -> Result<(), EngineError> {
        let mut seen = vec![false; self.n_slots()];
        let n_vocab = self.n_vocab();
        for s in batch {
            self.check_slot(s.slot)?;
            if std::mem::replace(&mut seen[s.slot], true) {
                return Err(EngineError::Param {
                    name: "batch",
                    message: format!("slot {} appears twice in one step", s.slot),
                });
            }
            let nt = s.tokens.len();
            // Executions hold at most `n_batch` tokens of one entry (see `plan`).
            crate::swa::check_step(
                self.engine.swa(),
                s.pos0,
                nt.min(self.n_batch),
                self.written[s.slot],
            )
            .map_err(|message| EngineError::Param {
                name: "KV",
                message: format!("slot {}: {message}", s.slot),
            })?;
            let written = self.written[s.slot];
            if self.engine.is_recurrent() && !self.engine.recurrent_step_ok(s.slot, s.pos0, written)
            {
                return Err(Engine::recurrent_step_error(s.pos0, written));
            }
            if nt == 0 || s.n_out == 0 || s.n_out > nt {
                return Err(EngineError::Param {
                    name: "batch",
                    message: format!("slot {}: {nt} tokens with {} output rows", s.slot, s.n_out),
                });
            }
            if s.pos0 > self.filled[s.slot] {
                return Err(EngineError::Param {
                    name: "pos0",
                    message: format!(
                        "slot {} holds {} positions, a step cannot start at {}",
                        s.slot, self.filled[s.slot], s.pos0
                    ),
                });
            }
            if s.pos0 + nt > self.slot_ctx {
                return Err(EngineError::ContextOverflow {
                    what: "this step",
                    needed: s.pos0 + nt,
                    n_ctx: self.slot_ctx,
                });
            }
            if let Some(&id) = s.tokens.iter().find(|&&t| t as usize >= n_vocab) {
                return Err(EngineError::BadToken { id, n_vocab });
            }
        }
        Ok(())
    }

    /// Cuts the step into executions of at most `n_batch` tokens: every entry in order,
    /// packed together when batching, each on its own otherwise. An entry cut across
    /// executions runs its earlier tokens first, so its later tokens see their KV. An
    /// entry's output rows are its last `n_out`, or with `head` its first.
    fn plan(&self, batch: &[SeqStep], head: bool) -> Vec<Exec> {
        let mut execs: Vec<Exec> = Vec::new();
        let mut cur = Exec::default();
        // An encoder's entry is a whole text whose tokens attend both ways: never cut.
        let cap = if self.engine.is_encoder() {
            usize::MAX
        } else {
            self.n_batch
        };
        for (e, s) in batch.iter().enumerate() {
            if !self.batching && cur.len() > 0 {
                execs.push(std::mem::take(&mut cur));
            }
            let base = s.slot * self.slot_ctx;
            let first_out = if head { 0 } else { s.tokens.len() - s.n_out };
            let outs = first_out..first_out + s.n_out;
            let end = s.pos0 + s.tokens.len();
            // A prompt's checkpoint marks inside this entry end an execution there.
            let marks = match self.prompt_end[s.slot] {
                Some(pe) if pe >= end => crate::checkpoint::prompt_marks(s.pos0, pe),
                _ => Vec::new(),
            };
            for (i, &tok) in s.tokens.iter().enumerate() {
                let p = s.pos0 + i;
                if i > 0 && marks.contains(&p) {
                    cur.checkpoints.push((s.slot, p));
                    execs.push(std::mem::take(&mut cur));
                }
                if cur.len() == cap {
                    execs.push(std::mem::take(&mut cur));
                }
                if outs.contains(&i) {
                    cur.out_rows.push(cur.len() as u32);
                    cur.dests.push(Some((e, i - first_out)));
                }
                cur.tokens.push(tok);
                cur.positions.push(p as u32);
                cur.cells.push((base + p) as u32);
                cur.spans.push([base as u32, (base + p + 1) as u32]);
            }
            if marks.contains(&end) {
                cur.checkpoints.push((s.slot, end));
            }
        }
        if cur.len() > 0 {
            execs.push(cur);
        }
        for x in &mut execs {
            // A graph returns at least one row: a prompt chunk with none wanted returns
            // its last one, discarded.
            if x.out_rows.is_empty() {
                x.out_rows.push(x.len() as u32 - 1);
                x.dests.push(None);
            }
        }
        execs
    }

    /// Runs one step for every entry (each slot at most once) and returns each entry's
    /// logits (`n_out * n_vocab` floats), in entry order. A slot's results do not depend
    /// on which other slots share the step. A refused step changes nothing; a step that
    /// fails while running, or panics, leaves each of its slots holding only the
    /// positions before its `pos0` (and the other slots untouched).
    pub fn step(&mut self, batch: &[SeqStep]) -> Result<Vec<Vec<f32>>, EngineError> {
        self.run_step(batch, Rows::Logits, false)
    }

    /// The embedding of `tokens` run as `slot`'s whole sequence from position 0 (one
    /// vector, or one per token with [`Pooling::None`]), unit length when `normalize`;
    /// as [`crate::embed::embed`] computes it on a lone engine. The slot's previous
    /// contents are gone afterwards (it holds `tokens`); no other slot is touched. An
    /// empty text or one longer than a slot is refused by name.
    pub fn embed(
        &mut self,
        slot: usize,
        tokens: &[u32],
        pooling: Pooling,
        normalize: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.check_slot(slot)?;
        if tokens.is_empty() {
            return Err(EngineError::Param {
                name: "input",
                message: "is empty: an embedding needs at least one token".into(),
            });
        }
        if tokens.len() > self.slot_ctx {
            return Err(EngineError::ContextOverflow {
                what: "the input",
                needed: tokens.len(),
                n_ctx: self.slot_ctx,
            });
        }
        let width = crate::embed::row_width(&self.engine, pooling)?;
        let n_batch = crate::embed::chunk_len(&self.engine, tokens.len(), self.n_batch)?;
        let kind = if pooling == Pooling::Rank {
            Rows::Scores
        } else {
            Rows::Hidden
        };
        self.filled[slot] = 0;
        crate::embed::pool(
            tokens,
            width,
            n_batch,
            pooling,
            normalize,
            |chunk, pos0, rows| {
                // The wanted rows are the chunk's tail, or its head (the first token's).
                let head = rows.end < chunk.len();
                let entry = SeqStep {
                    slot,
                    tokens: chunk.to_vec(),
                    pos0,
                    n_out: rows.len(),
                };
                Ok(self
                    .run_step(&[entry], kind, head)?
                    .pop()
                    .unwrap_or_default())
            },
        )
    }

    /// [`Self::step`], returning the rows `kind` names.
    /// With `head`, each entry's wanted rows are its first `n_out` instead of its last.
    fn run_step(
        &mut self,
        batch: &[SeqStep],
        kind: Rows,
        head: bool,
    ) -> Result<Vec<Vec<f32>>, EngineError> {
        self.validate(batch)?;
        if self.engine.is_recurrent() {
            for s in batch {
                // The slot's state must hold exactly `0..pos0`: a checkpoint is restored.
                if self
                    .engine
                    .prepare_recurrent_step(s.slot, s.pos0, self.written[s.slot])?
                {
                    self.written[s.slot] = s.pos0;
                }
            }
        }
        let width = match kind {
            Rows::Logits => self.n_vocab(),
            Rows::Hidden => self.engine.hparams().n_embd,
            Rows::Scores => self.engine.require_rank_head()?,
        };
        let mut out: Vec<Vec<f32>> = batch.iter().map(|s| vec![0.0; s.n_out * width]).collect();
        // The step rewrites each slot's rows from its `pos0` on: until it succeeds (an
        // error or an unwind out of a kernel included) a slot holds only the rows before.
        for s in batch {
            self.filled[s.slot] = self.filled[s.slot].min(s.pos0);
            // Rows from `pos0` on may be written even by a step that fails.
            let end = s.pos0 + s.tokens.len();
            self.written[s.slot] = crate::swa::written_after(s.pos0, end, self.written[s.slot]);
        }
        for x in self.plan(batch, head) {
            let rows = TokenRows {
                tokens: &x.tokens,
                positions: &x.positions,
                cells: &x.cells,
                spans: &x.spans,
                out_rows: &x.out_rows,
            };
            let logits = match kind {
                Rows::Logits => self.engine.forward_rows(&rows)?,
                Rows::Hidden => self.engine.forward_rows_hidden(&rows)?,
                Rows::Scores => self.engine.forward_rows_scores(&rows)?,
            };
            for (row, dest) in logits.chunks_exact(width).zip(&x.dests) {
                if let Some((e, r)) = *dest {
                    out[e][r * width..(r + 1) * width].copy_from_slice(row);
                }
            }
            for &(slot, pos) in &x.checkpoints {
                self.engine.take_checkpoint(slot, pos)?;
            }
        }
        for s in batch {
            let end = s.pos0 + s.tokens.len();
            self.filled[s.slot] = end;
            if self.prompt_end[s.slot].is_some_and(|pe| pe <= end) {
                self.prompt_end[s.slot] = None;
            }
        }
        Ok(out)
    }
}

/// What a step returns per output row.
#[derive(Clone, Copy)]
enum Rows {
    /// The logits (`n_vocab`).
    Logits,
    /// The hidden state (`n_embd`): embeddings.
    Hidden,
    /// The rank head's scores ([`Engine::rank_width`]).
    Scores,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_batch_value_is_an_engine_error_naming_the_variable() {
        // The parsing itself is `minfer_env`'s (tested there); this checks what reaches the
        // caller, without setting the variable under other tests' feet.
        let bad = minfer_env::BATCH.parse(Some("yes".into())).unwrap_err();
        let e = EngineError::from(bad).to_string();
        assert!(e.contains("MINFER_BATCH") && e.contains("yes"), "{e}");
    }
}
