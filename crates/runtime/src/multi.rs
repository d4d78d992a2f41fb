//! Several independent sequences ("slots") over one model: the server's engine.
//!
//! API CONTRACT (the server is written against it). Each slot owns a fixed share of the
//! context; a slot never observes another slot's KV. `step` runs one step for several
//! slots at once.

use std::path::Path;
use std::sync::Arc;

use minfer_gguf::GgufFile;

use crate::engine::{Engine, EngineError, EngineOptions};

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
    slots: Vec<Engine>,
    slot_ctx: usize,
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
        let probe = Engine::from_arc(Arc::clone(&file), opts)?;
        let slot_ctx = probe.n_ctx() / n_slots;
        if slot_ctx == 0 {
            return Err(EngineError::Param {
                name: "slots",
                message: format!("{n_slots} slots do not fit a context of {}", probe.n_ctx()),
            });
        }
        let mut o = opts.clone();
        o.n_ctx = Some(slot_ctx);
        let mut slots = Vec::with_capacity(n_slots);
        for _ in 0..n_slots {
            slots.push(Engine::from_arc(Arc::clone(&file), &o)?);
        }
        Ok(MultiEngine { slots, slot_ctx })
    }

    /// Number of slots.
    pub fn n_slots(&self) -> usize {
        self.slots.len()
    }

    /// Positions each slot holds.
    pub fn slot_ctx(&self) -> usize {
        self.slot_ctx
    }

    /// Vocabulary size (width of one logits row).
    pub fn n_vocab(&self) -> usize {
        self.slots[0].n_vocab()
    }

    /// The model file (tokenizer, metadata).
    pub fn file(&self) -> &GgufFile {
        self.slots[0].file()
    }

    /// Forgets a slot's KV contents.
    pub fn reset_slot(&mut self, slot: usize) -> Result<(), EngineError> {
        self.slot_mut(slot)?.reset();
        Ok(())
    }

    fn slot_mut(&mut self, slot: usize) -> Result<&mut Engine, EngineError> {
        let n = self.slots.len();
        self.slots.get_mut(slot).ok_or(EngineError::Param {
            name: "slot",
            message: format!("{slot} is not in 0..{n}"),
        })
    }

    /// Runs one step for every entry (each slot at most once) and returns each entry's
    /// logits (`n_out * n_vocab` floats), in entry order. A slot's results do not depend
    /// on which other slots share the step.
    pub fn step(&mut self, batch: &[SeqStep]) -> Result<Vec<Vec<f32>>, EngineError> {
        let mut out = Vec::with_capacity(batch.len());
        for s in batch {
            let e = self.slot_mut(s.slot)?;
            out.push(e.forward(&s.tokens, s.pos0, s.n_out)?);
        }
        Ok(out)
    }
}
