//! The runtime's side of sliding-window KV rings ([`minfer_graph::KvRing`]): which layers
//! are ringed, how many rows each keeps, and the rule every KV reuse obeys: a sequence may
//! go on from position `kept` only while its window's rows before `kept` are still held.
//!
//! Each sequence tracks `written`, one past the highest position stored since it last
//! started from position 0. The rows a ring holds are then exactly what
//! [`KvRing::keeps`] accepts; a rewind it refuses (a prefix reused far behind the last
//! written rows, a context shift) prefills from position 0 instead, never computing on
//! evicted rows.

use minfer_graph::{KvRing, RingParams};

/// The ringed layers of one engine and the ring parameters they were sized with.
#[derive(Debug, Clone, Default)]
pub struct SwaRings {
    /// Each layer's window, `None` for global layers.
    windows: Vec<Option<usize>>,
    /// The ring parameters, `None` when no layer is ringed (no windows, or full-size
    /// sliding-window KV asked for).
    params: Option<RingParams>,
    /// Tokens of one sequence per execution the rings hold beyond the window.
    step: usize,
    /// Full-size rows for windowed layers were asked for.
    full: bool,
}

impl SwaRings {
    /// The rings of a model whose layers have `windows`, with `seq_rows` virtual rows per
    /// sequence and at most `step` tokens of one sequence per execution; `full` keeps
    /// every row of windowed layers too (llama.cpp's `--swa-full`).
    pub fn new(windows: Vec<Option<usize>>, seq_rows: usize, step: usize, full: bool) -> Self {
        let params = RingParams { seq_rows, step };
        let any = windows.iter().flatten().any(|&w| params.ring(w).is_some());
        SwaRings {
            windows,
            params: (any && !full).then_some(params),
            step,
            full,
        }
    }

    /// The same rings for sequences of `seq_rows` virtual rows (slots sharing an arena).
    pub fn resized(&self, seq_rows: usize) -> Self {
        SwaRings::new(self.windows.clone(), seq_rows, self.step, self.full)
    }

    /// The step the rings were sized with, as a session records it (0: unringed).
    pub fn saved_step(&self) -> usize {
        self.params.map_or(0, |p| p.step.max(1))
    }

    /// The graph parameters' ring field.
    pub fn params(&self) -> Option<RingParams> {
        self.params
    }

    /// Layer `il`'s ring, if it has one.
    pub fn ring(&self, il: usize) -> Option<KvRing> {
        let w = self.windows.get(il).copied().flatten()?;
        self.params?.ring(w)
    }

    /// Whether any layer has a sliding window (ringed or not).
    pub fn windowed(&self) -> bool {
        self.windows.iter().any(Option::is_some)
    }

    /// Whether any layer is ringed.
    pub fn active(&self) -> bool {
        self.params.is_some()
    }

    /// The most tokens of one sequence one execution may hold (`usize::MAX` unringed).
    pub fn max_step(&self) -> usize {
        self.params.map_or(usize::MAX, |p| p.step.max(1))
    }

    /// Whether a sequence that stored positions up to `written` can go on from `kept`.
    pub fn keeps(&self, kept: usize, written: usize) -> bool {
        self.windows
            .iter()
            .enumerate()
            .all(|(il, w)| match (w, self.ring(il)) {
                (Some(w), Some(r)) => r.keeps(*w, kept, written),
                _ => true,
            })
    }

    /// The `written` mark of a sequence of `n` positions restored from rows a ring of
    /// `saved_step` (0: unringed) held: a larger ring here holds no more valid rows than
    /// the smaller one did, which a `written` further on expresses.
    pub fn restored_written(&self, n: usize, saved_step: usize) -> usize {
        match self.params {
            Some(p) if saved_step > 0 => n + p.step.max(1).saturating_sub(saved_step),
            _ => n,
        }
    }

    /// The physical row runs `(start, len)` of virtual rows `[base, base + n)` of one
    /// sequence in layer `il`, in virtual order (one run when unringed).
    pub fn runs(&self, il: usize, base: usize, n: usize) -> Vec<(usize, usize)> {
        let Some(r) = self.ring(il) else {
            return vec![(base, n)];
        };
        let (mut v, end) = (base, base + n);
        let mut out = Vec::new();
        while v < end {
            let hi = (v + r.rows).min(end);
            for (a, b) in r.segments(v, hi) {
                if b > a {
                    out.push((a, b - a));
                }
            }
            v = hi;
        }
        out
    }
}

/// One sequence's rewind check and `written` bookkeeping around a step at `pos0..end`:
/// the error when the step would read evicted rows.
pub(crate) fn check_step(
    rings: &SwaRings,
    pos0: usize,
    nt: usize,
    written: usize,
) -> Result<(), String> {
    if !rings.active() {
        return Ok(());
    }
    if nt > rings.max_step() {
        return Err(format!(
            "{nt} tokens of one sequence in one step, but the sliding-window KV rings were sized for {}",
            rings.max_step()
        ));
    }
    if pos0 < written && !rings.keeps(pos0, written) {
        return Err(format!(
            "going on from position {pos0} needs sliding-window KV rows that later positions (up to {written}) overwrote; prefill from position 0 instead"
        ));
    }
    Ok(())
}

/// The `written` mark after a successful step at `pos0..end`.
pub(crate) fn written_after(pos0: usize, end: usize, written: usize) -> usize {
    if pos0 == 0 {
        end
    } else {
        written.max(end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rings(full: bool) -> SwaRings {
        SwaRings::new(vec![Some(4), None, Some(4)], 100, 8, full)
    }

    #[test]
    fn windowed_layers_are_ringed_unless_full() {
        let r = rings(false);
        assert_eq!(r.ring(0).map(|r| r.rows), Some(11));
        assert_eq!(r.ring(1), None);
        assert!(r.active());
        assert!(!rings(true).active());
        assert_eq!(rings(true).ring(0), None);
        // A window no smaller than the sequence: nothing to ring.
        assert!(!SwaRings::new(vec![Some(99)], 100, 8, false).active());
    }

    #[test]
    fn steps_that_would_read_evicted_rows_are_refused() {
        let r = rings(false);
        assert!(check_step(&r, 50, 8, 50).is_ok());
        assert!(check_step(&r, 0, 8, 90).is_ok());
        assert!(
            check_step(&r, 50, 9, 50).is_err(),
            "a step past the ring's size"
        );
        let e = check_step(&r, 20, 1, 90).unwrap_err();
        assert!(e.contains("prefill from position 0"), "{e}");
        // Unringed, anything goes.
        assert!(check_step(&rings(true), 20, 100, 90).is_ok());
        assert_eq!(written_after(0, 5, 90), 5);
        assert_eq!(written_after(50, 51, 57), 57);
    }

    #[test]
    fn runs_follow_the_ring() {
        let r = rings(false);
        assert_eq!(r.runs(1, 0, 30), vec![(0, 30)]);
        let runs = r.runs(0, 5, 20);
        let rows: Vec<usize> = runs.iter().flat_map(|&(a, n)| a..a + n).collect();
        let ring = r.ring(0).unwrap();
        assert_eq!(rows, (5..25).map(|v| ring.row(v)).collect::<Vec<_>>());
    }

    #[test]
    fn a_restored_sequence_remembers_the_smaller_ring() {
        let r = rings(false);
        assert_eq!(r.restored_written(40, 0), 40);
        assert_eq!(r.restored_written(40, 8), 40);
        assert_eq!(r.restored_written(40, 2), 46);
    }
}
