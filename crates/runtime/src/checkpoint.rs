//! State checkpoints of hybrid recurrent models: bounded per-sequence copies of the
//! recurrent state taken while a prompt runs, so that a later prompt sharing only part
//! of what ran goes on from the last checkpoint inside the shared prefix instead of
//! from position 0 (llama.cpp's server keeps context checkpoints for the same reason).
//!
//! The policy. A prompt run from `pos0` to `end` stops at two marks to copy its
//! sequence's state: [`CHECKPOINT_TAIL`] tokens before its end, and at its end (the
//! state after its last token). In a chat the next turn's rendering usually departs
//! from what ran inside the generation prompt's last few tokens (a template that drops
//! the previous reasoning) or right after the prompt (the answer rendered otherwise),
//! so one of the two lies inside the shared prefix. A sequence keeps at most `max`
//! checkpoints (`--ctx-checkpoints`, 0 disables them); the oldest goes first, and one
//! at a position already held replaces it. A step that starts at `pos0` drops every
//! checkpoint past `pos0`, whose positions it rewrites, so a checkpoint at `c` always
//! describes the state after the tokens the sequence holds at `0..c`.
//!
//! This module holds the data and the policy only; the engine takes and restores the
//! copies (`Engine::resume_point`, `MultiEngine::checkpoint_prompt`).

/// Checkpoints a sequence keeps by default (`--ctx-checkpoints`): two per prompt, so
/// the last four prompts' marks.
pub const DEFAULT_CTX_CHECKPOINTS: usize = 8;

/// Tokens before a prompt's end where its first checkpoint is taken.
pub const CHECKPOINT_TAIL: usize = 4;

/// One recurrent layer's state in one slot: (layer, conv window values, delta-rule
/// matrix values).
pub(crate) type SlotState = (usize, Vec<f32>, Vec<f32>);

/// A copy of an engine's recurrent state (every slot) and the position it holds
/// (`Engine::snapshot_recurrent`).
#[derive(Debug, Clone)]
pub struct RecurrentSnapshot {
    pub(crate) states: Vec<SlotState>,
    pub(crate) written: usize,
}

/// A copy of one slot's recurrent state and the positions it holds
/// (`MultiEngine::snapshot_slot`): what a batched speculative step keeps to take back a
/// block whose drafts are rejected.
#[derive(Debug, Clone)]
pub struct SlotSnapshot {
    pub(crate) slot: usize,
    pub(crate) state: Vec<SlotState>,
    /// Positions the state had absorbed, and those the slot's KV held.
    pub(crate) written: usize,
    pub(crate) filled: usize,
}

impl SlotSnapshot {
    /// The slot it was taken from.
    pub fn slot(&self) -> usize {
        self.slot
    }

    /// The positions the slot's state held then (`0..positions()`).
    pub fn positions(&self) -> usize {
        self.written
    }
}

/// The positions in `(pos0, end]` where a prompt run from `pos0` to `end` takes a
/// checkpoint, increasing: `end - CHECKPOINT_TAIL` when it lies past `pos0`, and `end`.
/// Empty when nothing runs.
pub fn prompt_marks(pos0: usize, end: usize) -> Vec<usize> {
    let mut marks = Vec::with_capacity(2);
    if end <= pos0 {
        return marks;
    }
    if let Some(tail) = end.checked_sub(CHECKPOINT_TAIL).filter(|&t| t > pos0) {
        marks.push(tail);
    }
    marks.push(end);
    marks
}

/// Cuts a prompt run from `pos0` to `end` into steps of at most `n_batch` tokens that
/// end at each of [`prompt_marks`]: `(from, to, checkpoint after)` in order.
pub(crate) fn prompt_steps(pos0: usize, end: usize, n_batch: usize) -> Vec<(usize, usize, bool)> {
    let marks = prompt_marks(pos0, end);
    let mut steps = Vec::new();
    let mut at = pos0;
    for m in marks {
        while at < m {
            let to = m.min(at + n_batch.max(1));
            steps.push((at, to, to == m));
            at = to;
        }
    }
    steps
}

/// The state of one sequence after its positions `0..pos`.
#[derive(Debug, Clone)]
struct Checkpoint {
    pos: usize,
    state: Vec<SlotState>,
}

impl Checkpoint {
    fn bytes(&self) -> u64 {
        let floats: usize = self.state.iter().map(|(_, c, s)| c.len() + s.len()).sum();
        floats as u64 * 4
    }
}

/// What the checkpoints of an engine have done, for reports and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CheckpointStats {
    /// Checkpoints taken.
    pub taken: u64,
    /// Steps that went on from a restored checkpoint.
    pub restored: u64,
    /// Positions of the last restored checkpoint (the prefix it spared).
    pub last_restored: usize,
    /// Checkpoints held now, over every sequence.
    pub held: usize,
    /// Bytes they hold.
    pub bytes: u64,
}

/// Each sequence's checkpoints, at most `max` per sequence, oldest first.
#[derive(Debug, Clone, Default)]
pub(crate) struct CheckpointStore {
    max: usize,
    seqs: Vec<Vec<Checkpoint>>,
    taken: u64,
    restored: u64,
    last_restored: usize,
}

impl CheckpointStore {
    /// A store keeping at most `max` checkpoints per sequence (0: none).
    pub(crate) fn new(max: usize) -> Self {
        CheckpointStore {
            max,
            ..Self::default()
        }
    }

    /// Whether checkpoints are kept at all.
    pub(crate) fn enabled(&self) -> bool {
        self.max > 0
    }

    /// The largest checkpointed position of `seq` at most `kept`.
    pub(crate) fn best(&self, seq: usize, kept: usize) -> Option<usize> {
        self.seqs
            .get(seq)?
            .iter()
            .map(|c| c.pos)
            .filter(|&p| p <= kept)
            .max()
    }

    /// The state `seq` held after positions `0..pos`, if checkpointed.
    pub(crate) fn get(&self, seq: usize, pos: usize) -> Option<&[SlotState]> {
        self.seqs
            .get(seq)?
            .iter()
            .find(|c| c.pos == pos)
            .map(|c| c.state.as_slice())
    }

    /// Keeps `state` as `seq`'s state after positions `0..pos`: it replaces one at the
    /// same position, and the oldest goes when `seq` holds `max` already.
    pub(crate) fn insert(&mut self, seq: usize, pos: usize, state: Vec<SlotState>) {
        if !self.enabled() {
            return;
        }
        if self.seqs.len() <= seq {
            self.seqs.resize_with(seq + 1, Vec::new);
        }
        let list = &mut self.seqs[seq];
        list.retain(|c| c.pos != pos);
        while list.len() >= self.max {
            list.remove(0);
        }
        list.push(Checkpoint { pos, state });
        self.taken += 1;
    }

    /// Forgets `seq`'s checkpoints past `pos` (a step rewrites those positions).
    pub(crate) fn forget_past(&mut self, seq: usize, pos: usize) {
        if let Some(list) = self.seqs.get_mut(seq) {
            list.retain(|c| c.pos <= pos);
        }
    }

    /// Forgets every checkpoint of `seq` (its rows and state were replaced whole).
    /// Makes `dst`'s checkpoints copies of `src`'s at positions up to `upto` (a forked
    /// sequence holds `src`'s first `upto` positions, so it can go on from them too).
    /// Each copy costs what it costs in `src`; `dst` keeps no more than any sequence.
    pub(crate) fn copy(&mut self, src: usize, dst: usize, upto: usize) {
        if src == dst {
            return;
        }
        let list: Vec<Checkpoint> = self
            .seqs
            .get(src)
            .map(|l| l.iter().filter(|c| c.pos <= upto).cloned().collect())
            .unwrap_or_default();
        if self.seqs.len() <= dst {
            self.seqs.resize_with(dst + 1, Vec::new);
        }
        self.seqs[dst] = list;
    }

    pub(crate) fn clear(&mut self, seq: usize) {
        if let Some(list) = self.seqs.get_mut(seq) {
            list.clear();
        }
    }

    /// Records that a step went on from the checkpoint at `pos`.
    pub(crate) fn note_restored(&mut self, pos: usize) {
        self.restored += 1;
        self.last_restored = pos;
    }

    /// The counts and the memory held.
    pub(crate) fn stats(&self) -> CheckpointStats {
        let all = self.seqs.iter().flatten();
        CheckpointStats {
            taken: self.taken,
            restored: self.restored,
            last_restored: self.last_restored,
            held: all.clone().count(),
            bytes: all.map(Checkpoint::bytes).sum(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(v: f32) -> Vec<SlotState> {
        vec![(1, vec![v; 3], vec![v; 5])]
    }

    #[test]
    fn a_prompt_is_marked_before_its_tail_and_at_its_end() {
        assert_eq!(prompt_marks(0, 20), vec![16, 20]);
        // A tail mark at or before where the run starts is no new state.
        assert_eq!(prompt_marks(16, 20), vec![20]);
        assert_eq!(prompt_marks(0, 3), vec![3]);
        assert_eq!(prompt_marks(5, 5), Vec::<usize>::new());
    }

    #[test]
    fn prompt_steps_stop_at_the_marks_and_respect_the_batch() {
        assert_eq!(
            prompt_steps(0, 20, 8),
            vec![(0, 8, false), (8, 16, true), (16, 20, true)]
        );
        assert_eq!(prompt_steps(3, 20, 64), vec![(3, 16, true), (16, 20, true)]);
        assert_eq!(prompt_steps(19, 20, 64), vec![(19, 20, true)]);
        assert!(prompt_steps(4, 4, 8).is_empty());
    }

    #[test]
    fn the_store_is_bounded_replaces_equal_positions_and_forgets_rewritten_ones() {
        let mut s = CheckpointStore::new(3);
        for (i, pos) in [10, 20, 30].into_iter().enumerate() {
            s.insert(0, pos, state(i as f32));
        }
        assert_eq!(s.best(0, 25), Some(20));
        assert_eq!(s.best(0, 9), None);
        assert_eq!(s.best(1, 100), None, "another sequence holds none");
        // Full: the oldest (10) goes.
        s.insert(0, 40, state(3.0));
        assert_eq!(s.best(0, 15), None);
        assert_eq!(s.stats().held, 3);
        assert_eq!(s.stats().bytes, 3 * 8 * 4);
        // The same position again replaces, and the rest stay.
        s.insert(0, 30, state(9.0));
        assert_eq!(s.get(0, 30).map(|x| x[0].1[0]), Some(9.0));
        assert_eq!(s.stats().held, 3);
        s.forget_past(0, 30);
        assert_eq!(s.best(0, 100), Some(30));
        s.clear(0);
        assert_eq!(s.stats().held, 0);
        assert_eq!(s.stats().taken, 5);
        // Disabled: nothing is kept.
        let mut off = CheckpointStore::new(0);
        off.insert(0, 4, state(1.0));
        assert_eq!(off.best(0, 10), None);
        assert_eq!(off.stats().taken, 0);
    }
}
