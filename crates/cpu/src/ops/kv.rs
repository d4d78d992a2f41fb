//! The KV-cache store: token rows of K and V written into a layer's persistent regions
//! at the rows named by the `cells` input (invariant 1: the op carries only the layer),
//! in the region's storage format ([`KvType`]), and the block codec attention reads
//! packed rows back through.
//!
//! A region is a pool buffer of f32 words; a packed row is the format's bytes starting
//! on a word boundary (`KvType::row_words`), viewed as bytes without a copy.

use minfer_gguf::GgmlType;
use minfer_graph::{KvRing, KvType};

use super::as_i32;

/// The GGUF block type a KV format is encoded as.
fn ggml(t: KvType) -> GgmlType {
    match t {
        KvType::F32 => GgmlType::F32,
        KvType::F16 => GgmlType::F16,
        KvType::Q8_0 => GgmlType::Q8_0,
    }
}

/// Encodes `src` (whole blocks of `t`) into `dst`, exactly `t.bytes_for(src.len())` bytes.
pub fn encode(t: KvType, src: &[f32], dst: &mut [u8]) -> Result<(), String> {
    minfer_gguf::quant::quantize(ggml(t), src, dst).map_err(|e| format!("KV encode: {e}"))
}

/// Decodes `dst.len()` elements of format `t` from `src`.
pub fn decode(t: KvType, src: &[u8], dst: &mut [f32]) -> Result<(), String> {
    minfer_gguf::quant::dequantize(ggml(t), src, dst).map_err(|e| format!("KV decode: {e}"))
}

pub use super::kv_decode::{decode_packed, decode_rows, HeadBytes};

/// The byte offset of element `off` within a stored row (`off` is a whole number of
/// blocks, which the caller has checked).
pub fn byte_offset(t: KvType, off: usize) -> usize {
    t.bytes_for(off).unwrap_or(0)
}

/// Words of a region holding `n_ctx` rows of `n_embd` in format `t`; an error names a
/// row that is not whole blocks.
pub fn region_words(t: KvType, n_embd: usize, n_ctx: usize) -> Result<(usize, usize), String> {
    let row = t.row_words(n_embd).ok_or_else(|| {
        format!(
            "rows of {n_embd} cannot be stored as {t} (blocks of {})",
            t.block()
        )
    })?;
    Ok((row, row * n_ctx))
}

/// Writes `k` and `v` (`cells.len()` rows of `n_embd`) into rows `cells` of `k_region` and
/// `v_region` (`n_ctx` rows each, stored as `types[0]` and `types[1]`); with a `ring`,
/// `cells` are virtual rows it maps onto the `n_ctx` physical ones. Every cell is checked
/// before anything is written.
#[allow(clippy::too_many_arguments)]
pub fn store(
    layer: usize,
    n_embd: usize,
    n_ctx: usize,
    ring: Option<KvRing>,
    types: [KvType; 2],
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
    let (k_row, k_need) = region_words(types[0], n_embd, n_ctx)?;
    let (v_row, v_need) = region_words(types[1], n_embd, n_ctx)?;
    if k_region.len() < k_need || v_region.len() < v_need {
        return Err(format!(
            "KV store layer {layer}: regions hold {}/{} words, {n_ctx} rows of {n_embd} as {}/{} need {k_need}/{v_need}",
            k_region.len(),
            v_region.len(),
            types[0],
            types[1]
        ));
    }
    // A ringed layer's cells are virtual rows (see `KvRing`).
    let rows = ring.map_or(n_ctx, |r| r.virtual_rows(n_ctx));
    if let Some((t, c)) = cells
        .iter()
        .map(|&c| as_i32(c))
        .enumerate()
        .find(|&(_, c)| c < 0 || c as usize >= rows)
    {
        return Err(format!(
            "KV store layer {layer}: token {t} targets row {c}, outside the {rows}-row region"
        ));
    }
    for (t, &c) in cells.iter().enumerate() {
        let cell = as_i32(c) as usize;
        let cell = ring.map_or(cell, |r| r.row(cell));
        let src = t * n_embd..(t + 1) * n_embd;
        for (ty, row_words, x, region) in [
            (types[0], k_row, &k[src.clone()], &mut *k_region),
            (types[1], v_row, &v[src.clone()], &mut *v_region),
        ] {
            let row = &mut region[cell * row_words..(cell + 1) * row_words];
            if ty == KvType::F32 {
                row.copy_from_slice(x);
            } else {
                let bytes: &mut [u8] = bytemuck::cast_slice_mut(row);
                let n = byte_offset(ty, n_embd);
                encode(ty, x, &mut bytes[..n])?;
            }
        }
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
            None,
            [KvType::F32; 2],
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
        let e = store(
            5,
            2,
            4,
            None,
            [KvType::F32; 2],
            &[9.0; 4],
            &[9.0; 4],
            &bad,
            &mut kr,
            &mut vr,
        )
        .unwrap_err();
        assert!(e.contains("layer 5") && e.contains("row 4"), "{e}");
        assert_eq!(kr, before, "nothing is written when a cell is out of range");
    }

    #[test]
    fn a_ring_maps_virtual_cells_per_sequence() {
        // Two sequences of 10 virtual rows, 3 physical rows each.
        let ring = KvRing {
            rows: 3,
            seq_rows: 10,
        };
        let (mut kr, mut vr) = (vec![0.0; 6], vec![0.0; 6]);
        let cells = [4, 12, 19].map(f32::from_bits);
        store(
            0,
            1,
            6,
            Some(ring),
            [KvType::F32; 2],
            &[1.0, 2.0, 3.0],
            &[1.0, 2.0, 3.0],
            &cells,
            &mut kr,
            &mut vr,
        )
        .unwrap();
        // Position 4 of sequence 0 lands on row 1; positions 2 and 9 of sequence 1 on
        // rows 3 + 2 and 3 + 0.
        assert_eq!(kr, [0.0, 1.0, 0.0, 3.0, 0.0, 2.0]);
        let e = store(
            0,
            1,
            6,
            Some(ring),
            [KvType::F32; 2],
            &[1.0],
            &[1.0],
            &[f32::from_bits(20)],
            &mut kr,
            &mut vr,
        )
        .unwrap_err();
        assert!(e.contains("outside the 20-row region"), "{e}");
    }

    /// Packed rows land word-aligned at their cells and decode to the format's rounding
    /// of the values; the words past a row stay untouched.
    #[test]
    fn packed_rows_round_trip_at_their_cells() {
        let n_embd = 64;
        let x: Vec<f32> = (0..2 * n_embd)
            .map(|i| (i as f32 * 0.37).sin() * 3.0)
            .collect();
        let cells = [f32::from_bits(2), f32::from_bits(0)];
        for t in [KvType::F16, KvType::Q8_0] {
            let (row, words) = region_words(t, n_embd, 4).unwrap();
            let (mut kr, mut vr) = (vec![f32::NAN; words], vec![f32::NAN; words]);
            store(1, n_embd, 4, None, [t, t], &x, &x, &cells, &mut kr, &mut vr).unwrap();
            for (tok, cell) in [(0usize, 2usize), (1, 0)] {
                let bytes: &[u8] = bytemuck::cast_slice(&kr[cell * row..(cell + 1) * row]);
                let mut back = vec![0.0; n_embd];
                decode(t, &bytes[..byte_offset(t, n_embd)], &mut back).unwrap();
                let mut fast = vec![0.0; n_embd];
                decode_packed(t, &bytes[..byte_offset(t, n_embd)], &mut fast);
                assert_eq!(
                    fast, back,
                    "{t}: the inner-loop decoder is the reference one"
                );
                let want = &x[tok * n_embd..(tok + 1) * n_embd];
                let tol = if t == KvType::F16 { 2e-3 } else { 3.0 / 127.0 };
                for (a, b) in back.iter().zip(want) {
                    assert!((a - b).abs() <= tol, "{t}: {a} vs {b}");
                }
            }
            assert!(
                kr[row..2 * row].iter().all(|w| w.is_nan()),
                "{t}: row 1 untouched"
            );
        }
        let e = region_words(KvType::Q8_0, 48, 4).unwrap_err();
        assert!(e.contains("q8_0") && e.contains("48"), "{e}");
    }
}
