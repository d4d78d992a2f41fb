//! Which x86 row kernels run, and their entry points: the 512-bit ones where they run,
//! each finished by the AVX2 ones as those would take the rest, else the AVX2 ones.

use super::rows::Rows;
use super::rows_avx2 as avx2;
use super::vec512;

/// The x86 row kernels, for a head of whole registers: the 512-bit ones where they run
/// (`vec512::enabled`), each finished by the AVX2 ones as they would take the rest,
/// else the AVX2 ones. Constructed only where `VecIsa::Avx2` was detected (AVX2, FMA,
/// F16C). Each method checks that the rows it reads are in its view (panicking on a
/// caller's bug, as `vec`'s row checks do) and that its rows have one length.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RowIsa {
    wide: bool,
}

impl RowIsa {
    /// The kernels for head size `hd` where `VecIsa::Avx2` was detected (`avx2`): none
    /// without it or for a head that is not whole 8-value registers.
    #[inline]
    pub fn new(avx2: bool, hd: usize) -> Option<RowIsa> {
        (avx2 && hd.is_multiple_of(8) && hd > 0).then(|| RowIsa {
            wide: vec512::enabled(),
        })
    }

    /// `out[i] = q · k_i`.
    #[inline]
    pub fn dot_rows<R: Rows>(self, q: &[f32], k: R, out: &mut [f32]) {
        reads(k, out.len(), q.len());
        // SAFETY: `Avx2` was detected (constructor); the rows are in the view (checked).
        unsafe { avx2::dot_rows_in(q, k, 0, out) }
    }

    /// Two query rows (of one length) against the same keys, into two outputs (of one
    /// length): bitwise two [`Self::dot_rows`].
    #[inline]
    pub fn dot_rows2<R: Rows>(self, qa: &[f32], qb: &[f32], k: R, oa: &mut [f32], ob: &mut [f32]) {
        reads(k, oa.len(), qa.len());
        assert!(
            qa.len() == qb.len() && oa.len() == ob.len(),
            "row lengths differ"
        );
        let mut done = 0;
        if self.wide {
            // SAFETY: `wide` means AVX-512 F was detected beside AVX2, FMA and F16C;
            // rows as the caller guarantees.
            done = unsafe { vec512::dot_rows2(qa, qb, k, oa, ob) };
        }
        if done < oa.len() {
            // The rest row by row, as the AVX2 kernel takes it.
            // SAFETY: as above.
            unsafe {
                avx2::dot_rows_in(qa, k, done, &mut oa[done..]);
                avx2::dot_rows_in(qb, k, done, &mut ob[done..]);
            }
        }
    }

    /// Four query rows (of one length) against the same keys, into four outputs (of one
    /// length): bitwise four [`Self::dot_rows`].
    #[inline]
    pub fn dot_rows4<R: Rows>(self, q: [&[f32]; 4], k: R, out: [&mut [f32]; 4]) {
        let [o0, o1, o2, o3] = out;
        reads(k, o0.len(), q[0].len());
        let same = q.iter().all(|r| r.len() == q[0].len());
        assert!(
            same && [&o1, &o2, &o3].iter().all(|o| o.len() == o0.len()),
            "row lengths differ"
        );
        if !self.wide {
            self.dot_rows2(q[0], q[1], k, o0, o1);
            self.dot_rows2(q[2], q[3], k, o2, o3);
            return;
        }
        // SAFETY: as in `dot_rows2`.
        unsafe {
            let done = vec512::dot_rows4(q, k, [&mut *o0, &mut *o1, &mut *o2, &mut *o3]);
            if done < o0.len() {
                for (qr, o) in q.iter().zip([o0, o1, o2, o3]) {
                    avx2::dot_rows_in(qr, k, done, &mut o[done..]);
                }
            }
        }
    }

    /// `o += Σ_i p[i] * v_i`, each element's sum continued in `i` order.
    #[inline]
    pub fn weighted_rows_acc<R: Rows>(self, p: &[f32], v: R, o: &mut [f32]) {
        reads(v, p.len(), o.len());
        let mut done = 0;
        if self.wide {
            // SAFETY: as in `dot_rows2`.
            done = unsafe { vec512::weighted_rows_acc(p, v, o) };
        }
        if done < o.len() {
            // The last partial chunk as the AVX2 kernel computes it.
            // SAFETY: as in `dot_rows2`; `done` is a multiple of 64.
            unsafe { avx2::weighted_rows_acc_in(p, v, done, &mut o[done..]) };
        }
    }

    /// Two weight rows (of one length) over the same value rows, into two outputs (of
    /// one length): bitwise two [`Self::weighted_rows_acc`].
    #[inline]
    pub fn weighted_rows_acc2<R: Rows>(
        self,
        pa: &[f32],
        pb: &[f32],
        v: R,
        oa: &mut [f32],
        ob: &mut [f32],
    ) {
        reads(v, pa.len(), oa.len());
        assert!(
            pa.len() == pb.len() && oa.len() == ob.len(),
            "row lengths differ"
        );
        if !self.wide {
            self.weighted_rows_acc(pa, v, oa);
            self.weighted_rows_acc(pb, v, ob);
            return;
        }
        // SAFETY: as in `dot_rows2`; `done` is a multiple of 64.
        unsafe {
            let done = vec512::weighted_rows_accn([pa, pb], v, [&mut *oa, &mut *ob]);
            if done < oa.len() {
                avx2::weighted_rows_acc_in(pa, v, done, &mut oa[done..]);
                avx2::weighted_rows_acc_in(pb, v, done, &mut ob[done..]);
            }
        }
    }

    /// Four weight rows (of one length) over the same value rows, into four outputs (of
    /// one length): bitwise four [`Self::weighted_rows_acc`].
    #[inline]
    pub fn weighted_rows_acc4<R: Rows>(self, p: [&[f32]; 4], v: R, o: [&mut [f32]; 4]) {
        let [o0, o1, o2, o3] = o;
        reads(v, p[0].len(), o0.len());
        let same = p.iter().all(|r| r.len() == p[0].len());
        assert!(
            same && [&o1, &o2, &o3].iter().all(|x| x.len() == o0.len()),
            "row lengths differ"
        );
        if !self.wide {
            self.weighted_rows_acc2(p[0], p[1], v, o0, o1);
            self.weighted_rows_acc2(p[2], p[3], v, o2, o3);
            return;
        }
        // SAFETY: as in `dot_rows2`; `done` is a multiple of 64.
        unsafe {
            let done = vec512::weighted_rows_accn(p, v, [&mut *o0, &mut *o1, &mut *o2, &mut *o3]);
            if done < o0.len() {
                for (ph, oh) in p.iter().zip([o0, o1, o2, o3]) {
                    avx2::weighted_rows_acc_in(ph, v, done, &mut oh[done..]);
                }
            }
        }
    }
}

/// Panics unless `rows` rows of `width` values (a multiple of 8) are in the view: the
/// callers size their calls from the view's own geometry, so a failure is their bug.
#[inline(always)]
fn reads<R: Rows>(k: R, rows: usize, width: usize) {
    assert!(
        rows <= k.rows() && width <= k.width() && width.is_multiple_of(8),
        "rows out of the view"
    );
}
