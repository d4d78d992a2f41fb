//! What a wgpu dispatch binds and how it is sized: the resources of a bind group, a
//! weight's row ranges, the uniform parameter block, the 2-D grid.

/// Rows `row0..row0 + rows` of a weight, held by weight buffer `index`. A weight above
/// the adapter's largest storage binding is split by whole rows; most have one part.
#[derive(Debug, Clone, Copy)]
pub(super) struct Part {
    pub index: usize,
    pub row0: usize,
    pub rows: usize,
}

/// A weight's placement: its row ranges.
pub(super) type Parts = Vec<Part>;

/// The buffer index of a placement in one piece (vectors are bound whole).
pub(super) fn whole(parts: &Parts) -> Option<usize> {
    match parts.as_slice() {
        [p] => Some(p.index),
        _ => None,
    }
}

/// A resource bound into a kernel's bind group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum Res {
    Pool(usize),
    Weight(usize),
    /// The snapshot buffer of this many f32s (an input that aliases the output).
    Snap(usize),
    /// The rounded-activation scratch of this many f32s (a quantized matmul's input).
    Act(usize),
    /// Scratch `slot` of this many f32s, for values a fused node keeps to itself.
    Tmp(u8, usize),
}

/// u32 slots of a kernel's uniform parameter block (a multiple of four: 16-byte rows).
pub(super) const PARAMS: usize = 12;

/// A cached bind group: the kernel, its resources and its parameter block.
pub(super) type BindKey = (crate::kernels::Kernel, Vec<Res>, [u32; PARAMS]);

/// Bind groups kept before the cache is dropped wholesale (graphs are few and reused).
pub(super) const BIND_GROUP_CACHE: usize = 1 << 14;

/// Workgroups along x before a grid wraps into y (the WebGPU per-dimension minimum).
const MAX_GROUPS_X: u32 = 65_535;

/// A 2-D grid holding `groups` workgroups.
pub(super) fn grid(groups: usize) -> Result<(u32, u32), String> {
    let g = u32::try_from(groups).map_err(|_| format!("{groups} workgroups overflow u32"))?;
    let gx = g.clamp(1, MAX_GROUPS_X);
    let gy = g.div_ceil(gx).max(1);
    if gy > MAX_GROUPS_X {
        return Err(format!("{groups} workgroups exceed the dispatch grid"));
    }
    Ok((gx, gy))
}

/// `v` as a kernel parameter, or an error naming `what` when it does not fit.
pub(super) fn u32_of(v: usize, what: &str) -> Result<u32, String> {
    u32::try_from(v).map_err(|_| format!("{what} {v} does not fit the kernels' 32-bit indices"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grids_wrap_into_y_and_refuse_what_cannot_be_dispatched() {
        assert_eq!(grid(0).unwrap(), (1, 1));
        assert_eq!(grid(7).unwrap(), (7, 1));
        assert_eq!(grid(65_535).unwrap(), (65_535, 1));
        assert_eq!(grid(65_536).unwrap(), (65_535, 2));
        // 151936 rows of the default model's lm head, four per workgroup.
        let (gx, gy) = grid(151_936usize.div_ceil(4)).unwrap();
        assert!(gx as usize * gy as usize >= 37_984);
        assert!(grid(65_535 * 65_535 + 1).unwrap_err().contains("exceed"));
    }

    #[test]
    fn sizes_past_32_bits_are_named_errors() {
        assert_eq!(u32_of(5, "rows").unwrap(), 5);
        let e = u32_of(1 << 33, "rows").unwrap_err();
        assert!(e.contains("rows") && e.contains("32-bit"), "{e}");
    }
}
