//! The engine's side of a hybrid model's recurrent state: which positions a sequence
//! can go on from, the state checkpoints that let it go on from inside a reused prefix
//! ([`crate::checkpoint`]), and the copies sessions, forks and speculative rollback
//! take of the state slots.
//!
//! The state of a sequence holds exactly the positions it ran since it last started at
//! 0 (`written`) and cannot be rewound by moving a position. A step of a recurrent
//! model therefore starts at 0, at `written`, or at a checkpoint, which is restored into
//! the sequence's slot first; anything else is refused by name.

use super::{Engine, EngineError};
use crate::checkpoint::{self, CheckpointStats, RecurrentSnapshot, SlotState};

/// The refusal of a step that would rewind recurrent state.
fn rewind_error(pos0: usize, written: usize) -> EngineError {
    EngineError::Param {
        name: "recurrent state",
        message: format!(
            "going on from position {pos0} needs the recurrent state as it was there, but it \
             has absorbed positions up to {written} and no checkpoint holds {pos0}; prefill \
             from position 0 instead"
        ),
    }
}

impl Engine {
    /// Whether state that has absorbed positions `0..written` serves a sequence going
    /// on from `kept` as it stands: as its exact continuation, or from scratch.
    pub(crate) fn recurrent_continues(kept: usize, written: usize) -> bool {
        kept == 0 || kept == written
    }

    /// Whether the model has recurrent layers (Qwen3.5's Gated DeltaNet): their state
    /// holds exactly the positions run since the sequence last started at 0, so a
    /// sequence goes on only from where it stopped, from 0, or from a state checkpoint
    /// ([`Self::resume_point`]); rolling back takes a [`RecurrentSnapshot`].
    pub fn is_recurrent(&self) -> bool {
        self.recurrent
    }

    /// The largest position at most `kept` from which the current sequence can go on
    /// (a reused prefix): `kept` itself when [`Self::keeps`] says so, else, for a
    /// recurrent model, the last state checkpoint inside it, else 0. The next step may
    /// start there; a checkpoint is restored by that step.
    pub fn resume_point(&self, kept: usize) -> usize {
        if self.keeps(kept) {
            return kept;
        }
        if !self.recurrent {
            return 0;
        }
        self.checkpoints.best(0, kept.min(self.filled)).unwrap_or(0)
    }

    /// [`Self::resume_point`] for state slot `seq`, whose state absorbed `written`
    /// positions and whose KV holds `held`.
    pub(crate) fn recurrent_resume(
        &self,
        seq: usize,
        kept: usize,
        written: usize,
        held: usize,
    ) -> usize {
        if Self::recurrent_continues(kept, written) {
            return kept;
        }
        self.checkpoints.best(seq, kept.min(held)).unwrap_or(0)
    }

    /// Whether a step of slot `seq` may start at `pos0` with state that absorbed
    /// `written` positions: the exact continuation, from 0, or at a checkpoint.
    pub(crate) fn recurrent_step_ok(&self, seq: usize, pos0: usize, written: usize) -> bool {
        Self::recurrent_continues(pos0, written) || self.checkpoints.get(seq, pos0).is_some()
    }

    /// The refusal [`Self::recurrent_step_ok`] stands for.
    pub(crate) fn recurrent_step_error(pos0: usize, written: usize) -> EngineError {
        rewind_error(pos0, written)
    }

    /// Makes slot `seq` ready for a step from `pos0`: its checkpoints past `pos0` go (the
    /// step rewrites those positions) and, unless the state already holds exactly
    /// `0..pos0` (`written`, or a start from 0), the checkpoint at `pos0` is restored.
    /// Returns whether one was; refuses a position nothing holds.
    pub(crate) fn prepare_recurrent_step(
        &mut self,
        seq: usize,
        pos0: usize,
        written: usize,
    ) -> Result<bool, EngineError> {
        self.checkpoints.forget_past(seq, pos0);
        if Self::recurrent_continues(pos0, written) {
            return Ok(false);
        }
        let state = self
            .checkpoints
            .get(seq, pos0)
            .map(<[SlotState]>::to_vec)
            .ok_or_else(|| rewind_error(pos0, written))?;
        self.put_state_slot(seq, &state)?;
        self.checkpoints.note_restored(pos0);
        Ok(true)
    }

    /// Copies slot `seq`'s state, which holds positions `0..pos`, as a checkpoint
    /// (nothing when checkpoints are off or the model has no recurrent layers).
    pub(crate) fn take_checkpoint(&mut self, seq: usize, pos: usize) -> Result<(), EngineError> {
        if !self.recurrent || !self.checkpoints.enabled() {
            return Ok(());
        }
        let state = self.read_state_slot(seq)?;
        self.checkpoints.insert(seq, pos, state);
        Ok(())
    }

    /// Forgets every checkpoint of slot `seq` (its sequence was replaced).
    pub(crate) fn clear_checkpoints(&mut self, seq: usize) {
        self.checkpoints.clear(seq);
    }

    /// Whether prompts take state checkpoints (a recurrent model, `--ctx-checkpoints`
    /// above 0).
    pub(crate) fn checkpointing(&self) -> bool {
        self.recurrent && self.checkpoints.enabled()
    }

    /// Checkpoints taken and restored, and what they hold now.
    pub fn checkpoint_stats(&self) -> CheckpointStats {
        self.checkpoints.stats()
    }

    /// Bytes of one state checkpoint: per recurrent layer its conv window
    /// (`(d_conv - 1) x channels`) and its delta-rule matrices (`h_v x s_v x s_k`), f32;
    /// 0 for a model without recurrent layers.
    pub fn checkpoint_bytes(&self) -> u64 {
        (self.model.recurrent_state_floats() as u64).saturating_mul(4)
    }

    /// Prefills a prompt's `tokens` from position `pos0` as [`Self::prefill`] does,
    /// stopping at the checkpoint marks of [`crate::checkpoint`] to copy the state
    /// there; returns the last token's logits.
    pub fn prefill_prompt(&mut self, tokens: &[u32], pos0: usize) -> Result<Vec<f32>, EngineError> {
        Ok(self
            .prefill_prompt_with(tokens, pos0, |_| true)?
            .unwrap_or_default())
    }

    /// [`Self::prefill_prompt`], calling `each` with every step's tokens once it ran (and
    /// its checkpoint was taken); `each` returning false stops there (`None`).
    pub(crate) fn prefill_prompt_with(
        &mut self,
        tokens: &[u32],
        pos0: usize,
        mut each: impl FnMut(&[u32]) -> bool,
    ) -> Result<Option<Vec<f32>>, EngineError> {
        let end = self.prompt_end(tokens, pos0)?;
        let n_batch = self.n_batch.max(1);
        let steps = if self.checkpointing() {
            checkpoint::prompt_steps(pos0, end, n_batch)
        } else {
            (pos0..end)
                .step_by(n_batch)
                .map(|a| (a, end.min(a + n_batch), false))
                .collect()
        };
        let mut logits = Vec::new();
        for (a, b, mark) in steps {
            let chunk = &tokens[a - pos0..b - pos0];
            logits = self.forward(chunk, a, 1)?;
            if mark {
                self.take_checkpoint(0, b)?;
            }
            if !each(chunk) {
                return Ok(None);
            }
        }
        Ok(Some(logits))
    }

    /// A copy of every recurrent layer's state (all slots) and of the position it
    /// holds, for [`Self::restore_recurrent`] (speculative decoding's rollback). `None`
    /// for a model without recurrent layers or before the first step.
    pub fn snapshot_recurrent(&mut self) -> Option<RecurrentSnapshot> {
        if !self.recurrent {
            return None;
        }
        let states = self.cache.alloc_mut().snapshot_states();
        (!states.is_empty()).then_some(RecurrentSnapshot {
            states,
            written: self.written,
        })
    }

    /// Zeroes every recurrent layer's state in place, keeping the KV rows and the
    /// sequence's length: what going on without the state carried would compute. For
    /// the tests that prove the state is carried.
    #[doc(hidden)]
    pub fn zero_recurrent_state(&mut self) -> Result<(), EngineError> {
        let mut states = self.cache.alloc_mut().snapshot_states();
        for (_, conv, ssm) in &mut states {
            conv.fill(0.0);
            ssm.fill(0.0);
        }
        self.cache.alloc_mut().restore_states(&states)?;
        Ok(())
    }

    /// Puts back the recurrent state of `snap`: the sequence then holds the positions
    /// it held when the snapshot was taken (its KV rows past them are ignored, and so
    /// are its checkpoints past them).
    pub fn restore_recurrent(&mut self, snap: &RecurrentSnapshot) -> Result<(), EngineError> {
        self.cache.alloc_mut().restore_states(&snap.states)?;
        self.written = snap.written;
        self.filled = self.filled.min(snap.written);
        self.checkpoints.forget_past(0, snap.written);
        Ok(())
    }

    /// State slots of the recurrent regions: one per sequence the context holds.
    pub(crate) fn state_slots(&self) -> usize {
        (self.n_ctx / self.seq_rows).max(1)
    }

    /// Copies recurrent state slot `src` into slot `dst` in every recurrent layer (a
    /// forked sequence of `n` positions, [`crate::MultiEngine::copy_prefix`]); `dst`'s
    /// checkpoints become copies of `src`'s inside those positions, so the fork can go on
    /// from them as `src` can.
    pub(crate) fn copy_state_slot(
        &mut self,
        src: usize,
        dst: usize,
        n: usize,
    ) -> Result<(), EngineError> {
        let slots = self.state_slots();
        self.checkpoints.clear(dst);
        self.cache
            .alloc_mut()
            .copy_state_slot(src, dst, slots)
            .map_err(EngineError::from)?;
        self.checkpoints.copy(src, dst, n);
        Ok(())
    }

    /// Each recurrent layer's state values per slot: (layer, conv values, matrix values),
    /// in layer order; empty for a model without recurrent layers. Creates the regions.
    pub(crate) fn state_geometry(&mut self) -> Result<Vec<(usize, usize, usize)>, EngineError> {
        self.ensure_kv_regions()?;
        let slots = self.state_slots();
        let alloc = self.cache.alloc();
        Ok((0..self.hparams().n_layer)
            .filter_map(|l| alloc.kv_region(l).filter(|r| r.recurrent).map(|r| (l, r)))
            .map(|(l, r)| (l, r.k_words / slots, r.v_words / slots))
            .collect())
    }

    /// State slot `slot` of every recurrent layer: (layer, conv values, matrix values)
    /// as [`Self::state_geometry`] lists them. Reads that slot's windows only.
    pub(crate) fn read_state_slot(&mut self, slot: usize) -> Result<Vec<SlotState>, EngineError> {
        let geometry = self.state_geometry()?;
        let mut out = Vec::with_capacity(geometry.len());
        for (layer, conv, ssm) in geometry {
            let [c, s] = self.state_window(layer, slot, [conv, ssm], None)?;
            out.push((layer, c, s));
        }
        Ok(out)
    }

    /// Writes `state` (as [`Self::read_state_slot`] gives it) into state slot `slot`;
    /// the other slots keep theirs, and `slot`'s checkpoints go (a restored session).
    /// `state` must match [`Self::state_geometry`].
    pub(crate) fn write_state_slot(
        &mut self,
        slot: usize,
        state: &[SlotState],
    ) -> Result<(), EngineError> {
        self.put_state_slot(slot, state)?;
        self.checkpoints.clear(slot);
        Ok(())
    }

    /// Writes `state` into slot `slot` as it held positions `0..pos`: the slot's
    /// checkpoints past `pos` go, the others stay (a rolled-back speculative block).
    pub(crate) fn rewind_state_slot(
        &mut self,
        slot: usize,
        state: &[SlotState],
        pos: usize,
    ) -> Result<(), EngineError> {
        self.put_state_slot(slot, state)?;
        self.checkpoints.forget_past(slot, pos);
        Ok(())
    }

    /// [`Self::write_state_slot`] without touching the checkpoints.
    fn put_state_slot(&mut self, slot: usize, state: &[SlotState]) -> Result<(), EngineError> {
        let geometry = self.state_geometry()?;
        let shape: Vec<(usize, usize, usize)> = state
            .iter()
            .map(|(l, c, s)| (*l, c.len(), s.len()))
            .collect();
        if shape != geometry {
            return Err(EngineError::Param {
                name: "recurrent state",
                message: format!("state of shape {shape:?}, the model keeps {geometry:?}"),
            });
        }
        for (layer, conv, ssm) in state {
            self.state_window(*layer, slot, [conv.len(), ssm.len()], Some([conv, ssm]))?;
        }
        Ok(())
    }

    /// Reads (`write: None`) or writes slot `slot`'s window of `sizes` words in layer
    /// `layer`'s conv and matrix buffers, through the backend holding them.
    fn state_window(
        &mut self,
        layer: usize,
        slot: usize,
        sizes: [usize; 2],
        write: Option<[&[f32]; 2]>,
    ) -> Result<[Vec<f32>; 2], EngineError> {
        let fail = |why: String| EngineError::Param {
            name: "recurrent state",
            message: format!("layer {layer}, state slot {slot}: {why}"),
        };
        let alloc = self.cache.alloc_mut();
        let r = alloc
            .kv_region(layer)
            .filter(|r| r.recurrent)
            .ok_or_else(|| fail("no state region".into()))?;
        let b = alloc
            .backend_mut(r.backend)
            .ok_or_else(|| fail(format!("backend {} is not registered", r.backend)))?;
        let mut out = [Vec::new(), Vec::new()];
        for (i, (id, n)) in [(r.k, sizes[0]), (r.v, sizes[1])].into_iter().enumerate() {
            match write {
                Some(data) => b
                    .write_host_window(id, slot * n, data[i])
                    .map_err(|e| fail(e.to_string()))?,
                None => {
                    out[i] = b
                        .read_host_window(id, slot * n, n)
                        .map_err(|e| fail(e.to_string()))?
                }
            }
        }
        Ok(out)
    }
}
