//! The KV-cache store: token rows of K and V written into a layer's persistent regions
//! at the rows named by the `cells` input (invariant 1: the op carries only the layer).

use super::as_i32;

/// Writes `k` and `v` (`cells.len()` rows of `n_embd`) into rows `cells` of `k_region` and
/// `v_region` (`n_ctx` rows each). Every cell is checked before anything is written.
#[allow(clippy::too_many_arguments)]
pub fn store(
    layer: usize,
    n_embd: usize,
    n_ctx: usize,
    k: &[f32],
    v: &[f32],
    cells: &[f32],
    k_region: &mut [f32],
    v_region: &mut [f32],
) -> Result<(), String> {
    let nt = cells.len();
    if n_embd == 0 || k.len() < nt * n_embd || v.len() < nt * n_embd {
        return Err(format!(
            "KV store layer {layer}: k {} / v {} values for {nt} rows of {n_embd}",
            k.len(),
            v.len()
        ));
    }
    let need = n_embd * n_ctx;
    if k_region.len() < need || v_region.len() < need {
        return Err(format!(
            "KV store layer {layer}: regions hold {}/{} values, {n_ctx} rows of {n_embd} need {need}",
            k_region.len(),
            v_region.len()
        ));
    }
    if let Some((t, c)) = cells
        .iter()
        .map(|&c| as_i32(c))
        .enumerate()
        .find(|&(_, c)| c < 0 || c as usize >= n_ctx)
    {
        return Err(format!(
            "KV store layer {layer}: token {t} targets row {c}, outside the {n_ctx}-row region"
        ));
    }
    for (t, &c) in cells.iter().enumerate() {
        let row = as_i32(c) as usize * n_embd;
        let src = t * n_embd..(t + 1) * n_embd;
        k_region[row..row + n_embd].copy_from_slice(&k[src.clone()]);
        v_region[row..row + n_embd].copy_from_slice(&v[src]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_land_at_their_cells_and_bad_cells_write_nothing() {
        let (mut kr, mut vr) = (vec![0.0; 8], vec![0.0; 8]);
        let cells = [f32::from_bits(3), f32::from_bits(1)];
        store(
            0,
            2,
            4,
            &[1.0, 2.0, 3.0, 4.0],
            &[5.0, 6.0, 7.0, 8.0],
            &cells,
            &mut kr,
            &mut vr,
        )
        .unwrap();
        assert_eq!(kr, [0.0, 0.0, 3.0, 4.0, 0.0, 0.0, 1.0, 2.0]);
        assert_eq!(vr, [0.0, 0.0, 7.0, 8.0, 0.0, 0.0, 5.0, 6.0]);
        let before = kr.clone();
        let bad = [f32::from_bits(0), f32::from_bits(4)];
        let e = store(5, 2, 4, &[9.0; 4], &[9.0; 4], &bad, &mut kr, &mut vr).unwrap_err();
        assert!(e.contains("layer 5") && e.contains("row 4"), "{e}");
        assert_eq!(kr, before, "nothing is written when a cell is out of range");
    }
}
