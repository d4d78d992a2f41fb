//! The KV ring of a sliding-window layer (llama.cpp's iSWA cache): a local layer keeps
//! only the rows its window can still read, so a long context costs full KV rows only
//! for the global layers.
//!
//! Rows stay addressed by the same data as every other layer (invariant 1): a token's
//! `cells` entry and `span` pair name *virtual* rows, sequence `s` owning virtual rows
//! `[s * seq_rows, (s + 1) * seq_rows)` with position `p` at `s * seq_rows + p`. A ringed
//! layer maps virtual row `v` to physical row `(v / seq_rows) * rows + (v % seq_rows) %
//! rows`, so each sequence owns `rows` physical rows and position `p` overwrites
//! position `p - rows`.
//!
//! Why that is exact: a step writes every token's row before any token attends, and a
//! token at `p` reads positions `p - window + 1 ..= p`. With `rows >= window + step - 1`,
//! where `step` bounds the tokens one sequence adds in one execution, no row a token reads
//! is overwritten by another token of the same step, and a rolled-back step (rejected
//! drafts) overwrites only positions the window has already left behind. What a ring can
//! no longer serve is a *rewind* far behind the rows last written: reusing a prefix of
//! `kept` positions after positions up to `written` were stored is exact only when
//! [`KvRing::keeps`] says so; the runtime prefills from the start otherwise.

use serde::{Deserialize, Serialize};

/// The physical rows of one ringed layer: `rows` per sequence of `seq_rows` virtual rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct KvRing {
    /// Physical rows per sequence (at least the window plus a step, less one).
    pub rows: usize,
    /// Virtual rows per sequence (the context a sequence may reach).
    pub seq_rows: usize,
}

impl KvRing {
    /// The physical row of virtual row `v`.
    #[inline]
    pub fn row(&self, v: usize) -> usize {
        (v / self.seq_rows) * self.rows + (v % self.seq_rows) % self.rows
    }

    /// Physical rows of a region serving the whole sequences of `virtual_rows` virtual
    /// rows (at least one).
    pub fn physical_rows(&self, virtual_rows: usize) -> usize {
        (virtual_rows / self.seq_rows).max(1) * self.rows
    }

    /// Virtual rows a region of `physical_rows` rows serves.
    pub fn virtual_rows(&self, physical_rows: usize) -> usize {
        (physical_rows / self.rows) * self.seq_rows
    }

    /// Splits the virtual key range `[lo, hi)` of one sequence (at most `rows` long) into
    /// at most two physical ranges, in key order: the rows up to the ring's end, then
    /// the rows from its start. The second is empty when the range does not wrap.
    pub fn segments(&self, lo: usize, hi: usize) -> [(usize, usize); 2] {
        debug_assert!(hi - lo <= self.rows, "[{lo}, {hi}) is longer than the ring");
        let a = self.row(lo);
        let end = a - a % self.rows + self.rows;
        let len = hi - lo;
        if a + len <= end {
            [(a, a + len), (a, a)]
        } else {
            let first = end - a;
            let start = end - self.rows;
            [(a, end), (start, start + len - first)]
        }
    }

    /// Whether positions `0..kept` of a sequence are all still readable by its next
    /// tokens once positions up to `written` (exclusive) have been stored: the next token
    /// at `kept` reads back to `kept - window + 1`, and the ring holds positions from
    /// `written - rows` on.
    pub fn keeps(&self, window: usize, kept: usize, written: usize) -> bool {
        kept == 0 || kept + self.rows >= written + window.saturating_sub(1)
    }
}

/// What the builder needs to ring a sliding-window layer: the sequences' virtual rows and
/// the most tokens one sequence adds in one execution. Part of the reuse identity, as
/// every shape is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct RingParams {
    /// Virtual rows per sequence.
    pub seq_rows: usize,
    /// Most tokens of one sequence in one execution (a prompt chunk, a verify block).
    pub step: usize,
}

impl RingParams {
    /// The ring of a layer whose window is `window`, or `None` when a ring would not be
    /// smaller than the sequence's own rows (the layer then keeps every row).
    pub fn ring(&self, window: usize) -> Option<KvRing> {
        let rows = window.checked_add(self.step.max(1) - 1)?;
        (rows < self.seq_rows).then_some(KvRing {
            rows,
            seq_rows: self.seq_rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_wrap_per_sequence() {
        let r = KvRing {
            rows: 4,
            seq_rows: 10,
        };
        assert_eq!(
            (0..10).map(|v| r.row(v)).collect::<Vec<_>>(),
            [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
        );
        // Sequence 1 starts at virtual row 10 and physical row 4.
        assert_eq!(r.row(10), 4);
        assert_eq!(r.row(15), 5);
        assert_eq!(r.physical_rows(20), 8);
        assert_eq!(r.virtual_rows(8), 20);
    }

    #[test]
    fn segments_cover_the_range_in_key_order() {
        let r = KvRing {
            rows: 4,
            seq_rows: 10,
        };
        for s in 0..2 {
            for lo in 0..10 {
                for hi in lo + 1..=(lo + 4).min(10) {
                    let (lo, hi) = (lo + 10 * s, hi + 10 * s);
                    let segs = r.segments(lo, hi);
                    let rows: Vec<usize> = segs.iter().flat_map(|&(a, b)| a..b).collect();
                    let want: Vec<usize> = (lo..hi).map(|v| r.row(v)).collect();
                    assert_eq!(rows, want, "[{lo}, {hi})");
                }
            }
        }
    }

    #[test]
    fn a_ring_holds_the_window_plus_a_step() {
        let p = RingParams {
            seq_rows: 100,
            step: 8,
        };
        assert_eq!(p.ring(4).map(|r| r.rows), Some(11));
        // No smaller than the sequence: no ring.
        assert_eq!(p.ring(93), None);
        assert_eq!(
            RingParams {
                seq_rows: 100,
                step: 0
            }
            .ring(4)
            .map(|r| r.rows),
            Some(4)
        );
    }

    #[test]
    fn reuse_is_exact_only_while_the_window_is_held() {
        let r = KvRing {
            rows: 11,
            seq_rows: 100,
        };
        // Window 4: continuing where the rows end always works.
        assert!(r.keeps(4, 50, 50));
        // Drafts written up to 57 and rejected back to 50: 50 + 11 >= 57 + 3.
        assert!(r.keeps(4, 50, 57));
        assert!(!r.keeps(4, 50, 59));
        // Rewinding far back cannot be served; starting over always can.
        assert!(!r.keeps(4, 10, 50));
        assert!(r.keeps(4, 0, 50));
    }
}
