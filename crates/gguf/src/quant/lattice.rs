//! The lattice searches behind the IQ1, IQ2 and IQ3 encoders, after ggml's
//! `iq2xs_init_impl` / `iq3xs_init_impl` and their `*_find_best_neighbour` helpers.
//!
//! A grid point is a group of 8 (IQ1/IQ2) or 4 (IQ3) element *levels*; level `l` stands
//! for the odd magnitude `2l + 1` (IQ1 maps levels 0..3 to -1, 0, 1 plus a shift instead).
//! The levels are read off this crate's decoding grids, whose point order is ggml's.
//! Rounding a group at some scale gives a code (its levels packed `bits` apiece) that is
//! either a grid point or not; for every code that is not, the map lists the points
//! within the `nwant` smallest distinct squared distances, nearest first (ties by index),
//! and the encoder picks the weighted best of those. The maps are built once per grid,
//! on first use.

use super::iq_grids::{IQ1S_GRID, IQ2S_GRID, IQ2XS_GRID, IQ2XXS_GRID, IQ3S_GRID, IQ3XXS_GRID};
use std::sync::OnceLock;

/// What a code resolves to.
#[derive(Clone, Copy)]
enum Slot {
    /// The code is grid point `.0`.
    Point(u16),
    /// Not on the grid: its candidate points are `near[.0 .. .1]`.
    Near(u32, u32),
}

/// The code of a group's levels: `bits` per level, the first element lowest.
fn code_of(levels: impl IntoIterator<Item = u8>, bits: u32) -> usize {
    levels
        .into_iter()
        .enumerate()
        .fold(0, |c, (i, v)| c | (v as usize) << (bits as usize * i))
}

/// One grid with its code map and neighbour lists.
pub(crate) struct Lattice {
    /// Elements per point (8 or 4).
    group: usize,
    /// Bits per level in a code.
    bits: u32,
    /// The highest level any point uses; codes are built from levels `0..=max_level`.
    max_level: u8,
    /// Levels of point `p` at `levels[p * group..][..group]`.
    levels: Vec<u8>,
    /// Indexed by code; `None` for codes with a level above `max_level` (never built).
    slots: Vec<Option<Slot>>,
    /// The neighbour lists, back to back.
    near: Vec<u16>,
}

impl Lattice {
    /// Builds the map of a grid given as per-point levels, keeping for each off-grid code
    /// the points at its `nwant` smallest distinct distances.
    fn new(group: usize, bits: u32, levels: Vec<u8>, nwant: usize) -> Lattice {
        let npoints = levels.len() / group;
        let max_level = levels.iter().copied().max().unwrap_or(0);
        let ncodes = 1usize << (bits as usize * group);
        let mut slots = vec![None; ncodes];
        for (p, l) in levels.chunks_exact(group).enumerate() {
            slots[code_of(l.iter().copied(), bits)] = Some(Slot::Point(p as u16));
        }
        let mut near = Vec::new();
        let mask = (1usize << bits) - 1;
        let mut d2 = vec![0usize; npoints];
        // Distances in levels are at most `group · max_level²`: count them per value.
        let mut count = vec![0usize; group * (max_level as usize).pow(2) + 1];
        let mut code_levels = vec![0u8; group];
        for (code, slot) in slots.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            for (i, l) in code_levels.iter_mut().enumerate() {
                *l = ((code >> (bits as usize * i)) & mask) as u8;
            }
            if code_levels.iter().any(|&l| l > max_level) {
                continue;
            }
            // Squared distance in levels (a quarter of ggml's in odd magnitudes: same order).
            count.fill(0);
            for (p, d) in d2.iter_mut().enumerate() {
                *d = levels[p * group..(p + 1) * group]
                    .iter()
                    .zip(&code_levels)
                    .map(|(&a, &b)| (a as usize).abs_diff(b as usize).pow(2))
                    .sum();
                count[*d] += 1;
            }
            // The `nwant`-th smallest distance that occurs (or the largest, if fewer do).
            let mut limit = 0;
            let mut seen = 0;
            for (d, &c) in count.iter().enumerate() {
                if c > 0 {
                    limit = d;
                    seen += 1;
                    if seen == nwant {
                        break;
                    }
                }
            }
            let start = near.len() as u32;
            // Nearest first, ties in index order: ggml's sort of (distance, index) pairs.
            for (d, _) in count[..=limit].iter().enumerate().filter(|(_, &c)| c > 0) {
                near.extend((0..npoints).filter(|&p| d2[p] == d).map(|p| p as u16));
            }
            *slot = Some(Slot::Near(start, near.len() as u32));
        }
        Lattice {
            group,
            bits,
            max_level,
            levels,
            slots,
            near,
        }
    }

    /// A grid of 8-element points stored a byte per element, each byte mapped to its level.
    fn from_u64(grid: &[u64], level: impl Fn(u8) -> u8, nwant: usize) -> Lattice {
        let levels = grid
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .map(&level)
            .collect();
        Lattice::new(8, 2, levels, nwant)
    }

    /// A grid of 4-element points stored a byte per element, each byte mapped to its level.
    fn from_u32(grid: &[u32], level: impl Fn(u8) -> u8, nwant: usize) -> Lattice {
        let levels = grid
            .iter()
            .flat_map(|p| p.to_le_bytes())
            .map(&level)
            .collect();
        Lattice::new(4, 3, levels, nwant)
    }

    /// Elements per point.
    pub(crate) fn group(&self) -> usize {
        self.group
    }

    /// The highest level a point uses.
    #[cfg(test)]
    fn max_level(&self) -> u8 {
        self.max_level
    }

    /// The levels of point `p`.
    pub(crate) fn point(&self, p: u16) -> &[u8] {
        &self.levels[p as usize * self.group..][..self.group]
    }

    /// The point whose levels are `l` (each clamped to `max_level`), or the candidate
    /// points to search when there is none.
    pub(crate) fn locate(&self, l: &[u8]) -> Result<u16, &[u16]> {
        let code = code_of(l.iter().map(|&v| v.min(self.max_level)), self.bits);
        match self.slots[code] {
            Some(Slot::Point(p)) => Ok(p),
            Some(Slot::Near(a, b)) => Err(&self.near[a as usize..b as usize]),
            // Unreachable: every code of clamped levels is either a point or has a list.
            None => Ok(0),
        }
    }

    /// The candidate minimizing `Σ w (scale·value(l) − x)²` over its levels `l`, where
    /// `value` is what a level stands for: the odd magnitude `2l + 1` in IQ2/IQ3 (ggml's
    /// `iq2_find_best_neighbour` / `iq3_find_best_neighbour`), a shifted -1/0/1 in IQ1
    /// (`iq1_find_best_neighbour2`). The first on ties, and the first when every distance
    /// is NaN.
    pub(crate) fn nearest(
        &self,
        cands: &[u16],
        x: &[f32],
        w: &[f32],
        scale: f32,
        value: impl Fn(u8) -> f32,
    ) -> u16 {
        let mut best = (f32::MAX, cands.first().copied().unwrap_or(0));
        for &p in cands {
            let mut d2 = 0.0f32;
            for ((&l, &xi), &wi) in self.point(p).iter().zip(x).zip(w) {
                let diff = scale * value(l) - xi;
                d2 += wi * diff * diff;
            }
            if d2 < best.0 {
                best = (d2, p);
            }
        }
        best.1
    }
}

/// Defines a lazily built lattice.
macro_rules! lattice {
    ($(#[$doc:meta])* $name:ident, $build:expr) => {
        $(#[$doc])*
        pub(crate) fn $name() -> &'static Lattice {
            static L: OnceLock<Lattice> = OnceLock::new();
            L.get_or_init(|| $build)
        }
    };
}

// IQ2 grid bytes are 8, 25 and 43 for levels 0, 1, 2.
lattice!(
    /// IQ2_XXS's 256 points; two distances of neighbours.
    iq2xxs,
    Lattice::from_u64(&IQ2XXS_GRID, |b| b / 16, 2)
);
lattice!(
    /// IQ2_XS's 512 points; two distances of neighbours.
    iq2xs,
    Lattice::from_u64(&IQ2XS_GRID, |b| b / 16, 2)
);
lattice!(
    /// IQ2_S's 1024 points; neighbours at the nearest distance only.
    iq2s,
    Lattice::from_u64(&IQ2S_GRID, |b| b / 16, 1)
);
// IQ1 grid bytes are the values -1, 0, 1 as i8.
lattice!(
    /// The 2048 points IQ1_S and IQ1_M share; three distances of neighbours.
    iq1s,
    Lattice::from_u64(&IQ1S_GRID, |b| (b as i8 + 1) as u8, 3)
);
// IQ3_XXS bytes are 4, 12, .., 52 and 62 for levels 0..8; IQ3_S's are 2l + 1.
lattice!(
    /// IQ3_XXS's 256 points; two distances of neighbours.
    iq3xxs,
    Lattice::from_u32(&IQ3XXS_GRID, |b| b / 8, 2)
);
lattice!(
    /// IQ3_S's 512 points; three distances of neighbours.
    iq3s,
    Lattice::from_u32(&IQ3S_GRID, |b| b / 2, 3)
);

#[cfg(test)]
mod tests {
    use super::*;

    /// Codes of a grid's points in index order.
    fn codes(l: &Lattice) -> Vec<usize> {
        l.levels
            .chunks_exact(l.group)
            .map(|p| code_of(p.iter().copied(), l.bits))
            .collect()
    }

    #[test]
    fn levels_read_off_the_grids_are_ggmls_sorted_codes() {
        // ggml lists each grid as ascending codes; reading the levels back must agree, and
        // every level of the type must occur.
        for (name, l, top) in [
            ("iq2xxs", iq2xxs(), 2),
            ("iq2xs", iq2xs(), 2),
            ("iq2s", iq2s(), 2),
            ("iq1s", iq1s(), 2),
            ("iq3xxs", iq3xxs(), 7),
            ("iq3s", iq3s(), 7),
        ] {
            let c = codes(l);
            assert!(c.windows(2).all(|w| w[0] < w[1]), "{name}");
            assert_eq!(l.max_level(), top, "{name}");
        }
        // Spot checks against ggml's tables (kgrid_2bit_256[..4], kgrid_256[..4]).
        assert_eq!(&codes(iq2xxs())[..4], &[0, 2, 5, 8]);
        assert_eq!(&codes(iq3xxs())[..4], &[0, 2, 4, 9]);
    }

    #[test]
    fn every_code_resolves_and_neighbour_lists_are_nearest_first() {
        let l = iq3s();
        for code in 0..4096usize {
            let lv: Vec<u8> = (0..4).map(|i| ((code >> (3 * i)) & 7) as u8).collect();
            match l.locate(&lv) {
                Ok(p) => assert_eq!(l.point(p), &lv[..]),
                Err(c) => {
                    assert!(!c.is_empty());
                    let d = |p: u16| -> i32 {
                        l.point(p)
                            .iter()
                            .zip(&lv)
                            .map(|(&a, &b)| (a as i32 - b as i32).pow(2))
                            .sum()
                    };
                    assert!(c.windows(2).all(|w| d(w[0]) <= d(w[1])));
                }
            }
        }
    }
}
