//! Several repacked matrices that read the same activations as one product (q, k and v;
//! gate and up with the SwiGLU epilogue): the activations are quantized once and every
//! part runs in one pool region.

use super::{
    act_family, by_count, quantize, quantize_k, KTile, RepackedMatrix, Tiles, ROWS, TOKEN_GROUP,
};
use crate::matmul::{Disjoint, MatmulError, MatmulScratch};
use crate::quant::repack::{gemv, Act, Tile};
use crate::quant::Isa;
use crate::threadpool::{chunk_range, ThreadPool};
use minfer_gguf::quant::BlockQ8K;

/// The most matrices one [`matmul_repacked_multi`] call takes (q, k and v).
pub const MULTI_MAX_PARTS: usize = 4;

/// What each thread of [`matmul_repacked_multi_then`] does with its own output rows right
/// after computing them, inside the same pool region (so the rows are still in its cache
/// and no second region or serial pass follows).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MultiEpilogue {
    /// Nothing: the plain products.
    None,
    /// Two parts of equal rows, gate then up: each gate row `r` becomes
    /// `silu(gate[r]) * up[r]` (the bits of [`crate::ops::elementwise::swiglu_slice`]);
    /// the up rows stay.
    SwiGlu,
}

/// Several matrices that read the same activations, as one product: `x` (`nt x cols`) is
/// quantized once, and every thread takes one contiguous run of row groups of each part
/// (the run it would take in that part's own product, so the split is even whatever the
/// parts' sizes), all in one pool region instead of one per matrix. Part `p` = `(w, off)`
/// writes `y[t * ld + off + r]` for its rows `r`; the parts' column ranges must lie inside
/// `ld` and not overlap. Parts may mix types that read the same activation quantisation
/// (Q5_0 with Q8_0, Q4_K with Q6_K).
///
/// Every output element is the same kernel call on the same quantized activations as in
/// [`matmul_repacked_with`] on that part alone, so the results are bitwise equal to the
/// separate products. Meant for decode (a few tokens): every row group loops over all
/// tokens, so prefill-sized `nt` runs correctly but without the chunked schedule.
#[allow(clippy::too_many_arguments)]
pub fn matmul_repacked_multi(
    isa: Isa,
    pool: &ThreadPool,
    parts: &[(&RepackedMatrix, usize)],
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    ld: usize,
    scratch: &mut MatmulScratch,
) -> Result<(), MatmulError> {
    matmul_repacked_multi_then(isa, pool, parts, x, nt, y, ld, scratch, MultiEpilogue::None)
}

/// [`matmul_repacked_multi`] followed, in the same pool region, by `epi` on each thread's
/// own rows.
#[allow(clippy::too_many_arguments)]
pub fn matmul_repacked_multi_then(
    isa: Isa,
    pool: &ThreadPool,
    parts: &[(&RepackedMatrix, usize)],
    x: &[f32],
    nt: usize,
    y: &mut [f32],
    ld: usize,
    scratch: &mut MatmulScratch,
    epi: MultiEpilogue,
) -> Result<(), MatmulError> {
    if parts.len() > MULTI_MAX_PARTS || parts.is_empty() {
        return Err(MatmulError::Multi(format!(
            "{} matrices, expected 1 to {MULTI_MAX_PARTS}",
            parts.len()
        )));
    }
    let first = parts[0].0;
    let (ty, cols) = (first.ty, first.cols);
    if let Some((w, _)) = parts
        .iter()
        .find(|(w, _)| act_family(&w.tiles) != act_family(&first.tiles) || w.cols != cols)
    {
        return Err(MatmulError::Multi(format!(
            "{} weights of {} columns beside {ty} of {cols}",
            w.ty, w.cols
        )));
    }
    if epi == MultiEpilogue::SwiGlu && (parts.len() != 2 || parts[0].0.rows != parts[1].0.rows) {
        return Err(MatmulError::Multi(format!(
            "the SwiGLU epilogue takes gate and up of equal rows, got {} matrices",
            parts.len()
        )));
    }
    // Column ranges inside `ld` and pairwise disjoint: the writes below rely on it.
    for (i, (w, off)) in parts.iter().enumerate() {
        if off.checked_add(w.rows).is_none_or(|end| end > ld) {
            return Err(MatmulError::Multi(format!(
                "rows {off}..{off}+{} outside an output row of {ld}",
                w.rows
            )));
        }
        for (v, o2) in &parts[..i] {
            if *off < o2 + v.rows && *o2 < off + w.rows {
                return Err(MatmulError::Multi(format!(
                    "output rows {off}..{} overlap {o2}..{}",
                    off + w.rows,
                    o2 + v.rows
                )));
            }
        }
    }
    if nt.checked_mul(cols) != Some(x.len()) {
        return Err(MatmulError::Activations {
            got: x.len(),
            nt,
            cols,
        });
    }
    if nt.checked_mul(ld) != Some(y.len()) {
        return Err(MatmulError::Output {
            got: y.len(),
            nt,
            rows: ld,
        });
    }
    if nt == 0 {
        return Ok(());
    }
    let out = Disjoint::new(y);
    // One row group `g` of part `p` for tokens `t..t+n`, written to its rows.
    let emit = |p: usize, g: usize, t: usize, n: usize, res: [[f32; ROWS]; TOKEN_GROUP]| {
        let (w, off) = parts[p];
        let valid = (w.rows - g * ROWS).min(ROWS);
        for (k, r8) in res[..n].iter().enumerate() {
            for (r, &v) in r8[..valid].iter().enumerate() {
                // SAFETY: (token, row) pairs of one row group belong to it alone, each
                // group is handled by one thread, and the parts' rows do not overlap.
                unsafe { out.write((t + k) * ld + off + g * ROWS + r, v) };
            }
        }
    };
    // Thread `ith`'s row groups of part `p`: the same run as in that part's own product.
    let mine =
        |p: usize, ith: usize, nth: usize| chunk_range(parts[p].0.rows.div_ceil(ROWS), ith, nth);
    let epilogue = |ith: usize, nth: usize| {
        if epi != MultiEpilogue::SwiGlu {
            return;
        }
        let ((gate, g_off), (_, u_off)) = (parts[0], parts[1]);
        let gs = mine(0, ith, nth);
        // Both ends clamped: a thread that owns no group gets `groups..groups`, whose
        // start lies past the rows when they are not whole groups.
        let rows = (gs.start * ROWS).min(gate.rows)..(gs.end * ROWS).min(gate.rows);
        for t in 0..nt {
            let (g0, u0) = (t * ld + g_off, t * ld + u_off);
            // SAFETY: these rows of gate and of up (equal sizes, so the same groups) were
            // written by this thread alone in this region, and the parts do not overlap.
            let (g, u) = unsafe {
                (
                    out.slice(g0 + rows.start..g0 + rows.end),
                    out.slice(u0 + rows.start..u0 + rows.end),
                )
            };
            // SwiGLU reads gate and writes its place: a gate copy on the stack, in pieces
            // (element-wise, so any cut gives the same bits).
            let mut buf = [0.0f32; 256];
            for (gc, uc) in g.chunks_mut(256).zip(u.chunks(256)) {
                let b = &mut buf[..gc.len()];
                b.copy_from_slice(gc);
                crate::ops::elementwise::swiglu_slice(b, uc, gc);
            }
        }
    };
    let nb_q8 = cols / 32;
    let nb_k = cols / 256;
    if act_family(&first.tiles) == 0 {
        let (q, d, s) = quantize(isa, pool, x, nt, nb_q8, scratch);
        let act = |t: usize| Act {
            q: &q[t * nb_q8..(t + 1) * nb_q8],
            d: &d[t * nb_q8..(t + 1) * nb_q8],
            s: &s[t * nb_q8..(t + 1) * nb_q8],
        };
        fn one<'a, T: Tile>(
            isa: Isa,
            tiles: &[T],
            nb: usize,
            g: usize,
            t: usize,
            n: usize,
            act: &dyn Fn(usize) -> Act<'a>,
        ) -> [[f32; ROWS]; TOKEN_GROUP] {
            let w = &tiles[g * nb..(g + 1) * nb];
            by_count(
                n,
                t,
                act,
                |a| gemv(isa, w, a),
                |a| gemv(isa, w, a),
                |a| gemv(isa, w, a),
                |a| gemv(isa, w, a),
            )
        }
        pool.run(&|ith, nth| {
            for (p, (w, _)) in parts.iter().enumerate() {
                for g in mine(p, ith, nth) {
                    let mut t = 0;
                    while t < nt {
                        let n = (nt - t).min(TOKEN_GROUP);
                        let res = match &w.tiles {
                            Tiles::Q8_0(tl) => one(isa, tl, nb_q8, g, t, n, &act),
                            Tiles::Q5_0(tl) => one(isa, tl, nb_q8, g, t, n, &act),
                            Tiles::Iq4Nl(tl) => one(isa, tl, nb_q8, g, t, n, &act),
                            _ => unreachable!("one activation family per call (checked)"),
                        };
                        emit(p, g, t, n, res);
                        t += n;
                    }
                }
            }
            epilogue(ith, nth);
        });
    } else {
        let q = quantize_k(isa, pool, x, nt, nb_k, scratch);
        fn one<T: KTile>(
            isa: Isa,
            tiles: &[T],
            q: &[BlockQ8K],
            nb: usize,
            g: usize,
            t: usize,
            n: usize,
        ) -> [[f32; ROWS]; TOKEN_GROUP] {
            let w = &tiles[g * nb..(g + 1) * nb];
            let act = |t: usize| &q[t * nb..(t + 1) * nb];
            by_count(
                n,
                t,
                act,
                |a| T::gemv(isa, w, a),
                |a| T::gemv(isa, w, a),
                |a| T::gemv(isa, w, a),
                |a| T::gemv(isa, w, a),
            )
        }
        pool.run(&|ith, nth| {
            for (p, (w, _)) in parts.iter().enumerate() {
                for g in mine(p, ith, nth) {
                    let mut t = 0;
                    while t < nt {
                        let n = (nt - t).min(TOKEN_GROUP);
                        let res = match &w.tiles {
                            Tiles::Q4K(tl) => one(isa, tl, q, nb_k, g, t, n),
                            Tiles::Q6K(tl) => one(isa, tl, q, nb_k, g, t, n),
                            Tiles::Iq4Xs(tl) => one(isa, tl, q, nb_k, g, t, n),
                            _ => unreachable!("one activation family per call (checked)"),
                        };
                        emit(p, g, t, n, res);
                        t += n;
                    }
                }
            }
            epilogue(ith, nth);
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::testutil::{aligned, run_repacked};
    use super::*;
    use crate::matmul::QMatrix;
    use crate::quant::testutil::{isas, rand_f32};
    use minfer_gguf::quant::quantize_to_vec;
    use minfer_gguf::GgmlType;

    /// One multi-matrix product gives each matrix's own bits, at its place in the shared
    /// output rows, for every type, token count, thread count and ISA.
    #[test]
    fn multi_matches_the_separate_products_bitwise() {
        use GgmlType::{Q4K, Q5_0, Q6K, Q8_0};
        // One type, and the mixes that share an activation quantisation (the default
        // model's Q5_0 q and k beside a Q8_0 v; Q4_K beside Q6_K).
        let sets = [
            [Q5_0; 3],
            [Q8_0; 3],
            [Q4K; 3],
            [Q6K; 3],
            [Q5_0, Q5_0, Q8_0],
            [Q4K, Q6K, Q4K],
        ];
        for tys in sets {
            let ty = tys[0];
            let cols = 512;
            // q, k, v shaped: 37 rows (not whole row groups), then 8 and 13.
            let mats: Vec<RepackedMatrix> = [37usize, 8, 13]
                .iter()
                .zip(tys)
                .enumerate()
                .map(|(i, (&rows, ty))| {
                    let wf = rand_f32(rows * cols, 100 + i as u64 + ty.id() as u64, 1.0);
                    let bytes = quantize_to_vec(ty, &wf).unwrap();
                    let store = aligned(&bytes);
                    let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
                    RepackedMatrix::from_qmatrix(&QMatrix {
                        ty,
                        data,
                        rows,
                        cols,
                    })
                    .unwrap()
                })
                .collect();
            // Output rows: k first, a gap, then q, then v (any placement is allowed).
            let offs = [10usize, 0, 47];
            let ld = 64;
            for nt in [1, 2, 4, 5] {
                let x = rand_f32(nt * cols, nt as u64 + 3, 2.0);
                let parts: Vec<(&RepackedMatrix, usize)> = mats.iter().zip(offs).collect();
                for isa in isas() {
                    for threads in [1, 2, 3] {
                        let pool = ThreadPool::new(threads);
                        let mut y = vec![f32::NAN; nt * ld];
                        let mut s = MatmulScratch::new();
                        matmul_repacked_multi(isa, &pool, &parts, &x, nt, &mut y, ld, &mut s)
                            .unwrap();
                        for (m, off) in &parts {
                            let want = run_repacked(isa, 1, m, &x, nt);
                            for t in 0..nt {
                                for r in 0..m.rows() {
                                    let (g, w) = (y[t * ld + off + r], want[t * m.rows() + r]);
                                    assert_eq!(
                                        g.to_bits(),
                                        w.to_bits(),
                                        "{ty} nt={nt} {isa:?} t={threads} row {r} at {off}"
                                    );
                                }
                            }
                        }
                        // The gap (rows 8..10) is not written.
                        assert!((0..nt).all(|t| y[t * ld + 8].is_nan() && y[t * ld + 9].is_nan()));
                    }
                }
            }
        }
    }

    /// Matrices that do not fit one product are refused with the reason, never computed.
    #[test]
    fn multi_refuses_parts_that_do_not_fit() {
        let mk = |ty: GgmlType, rows: usize, cols: usize| {
            let wf = rand_f32(rows * cols, 5, 1.0);
            let bytes = quantize_to_vec(ty, &wf).unwrap();
            let store = aligned(&bytes);
            let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
            RepackedMatrix::from_qmatrix(&QMatrix {
                ty,
                data,
                rows,
                cols,
            })
            .unwrap()
        };
        let (a, b) = (mk(GgmlType::Q8_0, 16, 256), mk(GgmlType::Q8_0, 8, 256));
        let (c, d) = (mk(GgmlType::Q4K, 8, 256), mk(GgmlType::Q8_0, 8, 512));
        let pool = ThreadPool::new(2);
        let x = rand_f32(256, 1, 1.0);
        let run = |parts: &[(&RepackedMatrix, usize)], ld: usize| {
            let mut y = vec![0.0; ld];
            let e = matmul_repacked_multi(
                Isa::detect(),
                &pool,
                parts,
                &x,
                1,
                &mut y,
                ld,
                &mut MatmulScratch::new(),
            );
            e.unwrap_err().to_string()
        };
        assert!(run(&[(&a, 0), (&b, 8)], 24).contains("overlap"));
        assert!(run(&[(&a, 0), (&b, 20)], 24).contains("outside"));
        assert!(run(&[(&a, 0), (&c, 16)], 24).contains("Q4_K"));
        assert!(run(&[(&a, 0), (&d, 16)], 24).contains("512"));
        assert!(run(&[], 24).contains("0 matrices"));
        let five = [(&b, 0), (&b, 8), (&b, 16), (&b, 24), (&b, 32)];
        assert!(run(&five, 40).contains("5 matrices"));
    }

    /// The SwiGLU epilogue gives the bits of the two products followed by the serial
    /// SwiGLU over whole rows (what the unfused nodes compute), and leaves the up rows as
    /// the product wrote them; it refuses parts that are not a gate and an up of one size.
    #[test]
    fn multi_swiglu_epilogue_matches_the_separate_chain() {
        for ty in [
            GgmlType::Q5_0,
            GgmlType::Q8_0,
            GgmlType::Q4K,
            GgmlType::Q6K,
            GgmlType::Iq4Nl,
            GgmlType::Iq4Xs,
        ] {
            let (rows, cols) = (77usize, 256);
            let mats: Vec<RepackedMatrix> = (0..2u64)
                .map(|i| {
                    let wf = rand_f32(rows * cols, 40 + i, 1.0);
                    let bytes = quantize_to_vec(ty, &wf).unwrap();
                    let store = aligned(&bytes);
                    let data = &bytemuck::cast_slice::<u64, u8>(&store)[..bytes.len()];
                    RepackedMatrix::from_qmatrix(&QMatrix {
                        ty,
                        data,
                        rows,
                        cols,
                    })
                    .unwrap()
                })
                .collect();
            let parts = [(&mats[0], 0), (&mats[1], rows)];
            let ld = 2 * rows;
            for nt in [1, 3, 6] {
                let x = rand_f32(nt * cols, 9 + nt as u64, 3.0);
                for isa in isas() {
                    let (g, u) = (
                        run_repacked(isa, 1, &mats[0], &x, nt),
                        run_repacked(isa, 1, &mats[1], &x, nt),
                    );
                    let mut want = vec![0.0; nt * rows];
                    crate::ops::elementwise::swiglu_slice(&g, &u, &mut want);
                    // 12 threads: more than the 10 row groups, so some threads own none.
                    for threads in [1, 2, 3, 12] {
                        let pool = ThreadPool::new(threads);
                        let mut y = vec![f32::NAN; nt * ld];
                        let mut s = MatmulScratch::new();
                        matmul_repacked_multi_then(
                            isa,
                            &pool,
                            &parts,
                            &x,
                            nt,
                            &mut y,
                            ld,
                            &mut s,
                            MultiEpilogue::SwiGlu,
                        )
                        .unwrap();
                        for t in 0..nt {
                            for r in 0..rows {
                                let at = format!("{ty} nt={nt} {isa:?} t={threads} {t}/{r}");
                                let (a, b) = (y[t * ld + r], want[t * rows + r]);
                                assert_eq!(a.to_bits(), b.to_bits(), "gate {at}");
                                let (a, b) = (y[t * ld + rows + r], u[t * rows + r]);
                                assert_eq!(a.to_bits(), b.to_bits(), "up {at}");
                            }
                        }
                    }
                }
            }
            let pool = ThreadPool::new(2);
            let x = rand_f32(cols, 1, 1.0);
            let mut y = vec![0.0; 3 * rows];
            let e = matmul_repacked_multi_then(
                Isa::detect(),
                &pool,
                &[(&mats[0], 0), (&mats[1], rows), (&mats[1], 2 * rows)],
                &x,
                1,
                &mut y,
                3 * rows,
                &mut MatmulScratch::new(),
                MultiEpilogue::SwiGlu,
            );
            assert!(e.unwrap_err().to_string().contains("gate and up"));
        }
    }
}
