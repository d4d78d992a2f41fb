//! Row gathers: the token-embedding lookup from a (possibly quantized) table, and the
//! selection of activation rows (e.g. the last token's) by I32 ids.

use minfer_gguf::quant::dequantize;
use minfer_gguf::GgmlType;

use super::{as_i32, par_rows, PAR_MIN_ELEMS};
use crate::threadpool::ThreadPool;

/// A row-major table of `rows` rows of `row_len` elements of `ty`.
#[derive(Debug, Clone, Copy)]
pub struct Table<'a> {
    /// Element type.
    pub ty: GgmlType,
    /// Raw bytes.
    pub data: &'a [u8],
    /// Elements per row.
    pub row_len: usize,
    /// Rows.
    pub rows: usize,
}

/// Dequantizes the rows named by `ids` (I32 bit patterns) into `out` (`ids.len()` rows of
/// `row_len`), touching only those rows.
pub fn embed(pool: &ThreadPool, t: &Table, ids: &[f32], out: &mut [f32]) -> Result<(), String> {
    let d = t.row_len;
    let block = t.ty.block_size();
    if d == 0 || !d.is_multiple_of(block) {
        return Err(format!(
            "embedding: row length {d} is not a positive multiple of the {} block size {block}",
            t.ty
        ));
    }
    let row_bytes = d / block * t.ty.type_size();
    if t.data.len() != row_bytes * t.rows {
        return Err(format!(
            "embedding: {} bytes for {} {} rows of {d}",
            t.data.len(),
            t.rows,
            t.ty
        ));
    }
    if out.len() != ids.len() * d {
        return Err(format!(
            "embedding: {} outputs for {} ids of {d}",
            out.len(),
            ids.len()
        ));
    }
    if let Some((i, id)) = ids
        .iter()
        .map(|&v| as_i32(v))
        .enumerate()
        .find(|&(_, id)| id < 0 || id as usize >= t.rows)
    {
        return Err(format!(
            "embedding: id {id} (token {i}) outside the table's {} rows",
            t.rows
        ));
    }
    let failed = std::sync::Mutex::new(None);
    par_rows(pool, out, d, out.len() >= PAR_MIN_ELEMS, &|r0, ys| {
        for (i, yr) in ys.chunks_exact_mut(d).enumerate() {
            let id = as_i32(ids[r0 + i]) as usize;
            if let Err(e) = dequantize(t.ty, &t.data[id * row_bytes..(id + 1) * row_bytes], yr) {
                *failed.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
            }
        }
    });
    match failed.into_inner().unwrap_or_else(|p| p.into_inner()) {
        Some(e) => Err(format!("embedding: {e}")),
        None => Ok(()),
    }
}

/// Copies rows of `d` values of `x` selected by `ids` into `out` (`ids.len()` rows).
pub fn gather(x: &[f32], d: usize, ids: &[f32], out: &mut [f32]) -> Result<(), String> {
    let rows = x.len().checked_div(d).unwrap_or(0);
    if d == 0 || out.len() != ids.len() * d {
        return Err(format!(
            "get_rows: {} outputs for {} ids of {d}",
            out.len(),
            ids.len()
        ));
    }
    for (i, (yr, &v)) in out.chunks_exact_mut(d).zip(ids).enumerate() {
        let id = as_i32(v);
        if id < 0 || id as usize >= rows {
            return Err(format!(
                "get_rows: id {id} (row {i}) outside the {rows} input rows"
            ));
        }
        let s = id as usize * d;
        yr.copy_from_slice(&x[s..s + d]);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::quant::{dequantize_to_vec, quantize_to_vec};
    use minfer_testkit::Rng;

    fn ids(v: &[i32]) -> Vec<f32> {
        v.iter().map(|&i| f32::from_bits(i as u32)).collect()
    }

    #[test]
    fn embedding_dequantizes_exactly_the_selected_rows() {
        let mut r = Rng::new(4);
        let (d, rows) = (64, 10);
        let vals = r.vec(d * rows, 1.0);
        let pool = ThreadPool::new(2);
        for ty in [GgmlType::F32, GgmlType::F16, GgmlType::Q8_0, GgmlType::Q4_0] {
            let data = quantize_to_vec(ty, &vals).unwrap();
            let full = dequantize_to_vec(ty, &data, d * rows).unwrap();
            let t = Table {
                ty,
                data: &data,
                row_len: d,
                rows,
            };
            let sel = [9, 0, 3, 3];
            let mut out = vec![0.0; sel.len() * d];
            embed(&pool, &t, &ids(&sel), &mut out).unwrap();
            for (i, &s) in sel.iter().enumerate() {
                assert_eq!(
                    &out[i * d..(i + 1) * d],
                    &full[s as usize * d..(s as usize + 1) * d]
                );
            }
            let e = embed(&pool, &t, &ids(&[10]), &mut out[..d]).unwrap_err();
            assert!(e.contains("id 10"), "{e}");
            assert!(embed(&pool, &t, &ids(&[-1]), &mut out[..d]).is_err());
        }
    }

    #[test]
    fn gather_selects_rows_and_checks_ids() {
        let x = [0.0, 1.0, 2.0, 3.0, 4.0, 5.0];
        let mut out = [0.0; 4];
        gather(&x, 2, &ids(&[2, 0]), &mut out).unwrap();
        assert_eq!(out, [4.0, 5.0, 0.0, 1.0]);
        assert!(gather(&x, 2, &ids(&[3, 0]), &mut out).is_err());
        assert!(gather(&x, 2, &ids(&[0]), &mut out).is_err());
    }
}
