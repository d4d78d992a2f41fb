//! The exponential of `exp` sixteen lanes at a time in 512-bit registers, for softmax and
//! SwiGLU where the quantized kernels run their AVX-512 VNNI path (so a cap to AVX2 turns
//! this off too).
//!
//! Each lane runs the double-precision steps of [`super::exp::expf`] in the same order,
//! so the bits are those of the scalar reference and of the AVX2 kernel. Only the table
//! lookup differs in form: the 32 entries sit in four registers and two two-source
//! permutes pick them (entries 0–15 and 16–31, bit 4 of the index choosing), where the
//! AVX2 kernel gathers from memory.

use super::exp_table::{fix_special, C0, C1, C2, INV_LN2_N, SHIFT, TAB};
use std::arch::x86_64::*;

/// The table in four registers of eight entries.
#[inline]
#[target_feature(enable = "avx512f")]
fn table() -> [__m512i; 4] {
    // SAFETY: TAB holds 32 u64; each load reads eight of them.
    std::array::from_fn(|i| unsafe { _mm512_loadu_si512(TAB.as_ptr().add(8 * i).cast()) })
}

/// Eight lanes of `expf` in double precision (no special-case inputs).
#[inline]
#[target_feature(enable = "avx512f")]
fn exp8d(x: __m256, tab: &[__m512i; 4]) -> __m256 {
    let shift = _mm512_set1_pd(SHIFT);
    let z = _mm512_mul_pd(_mm512_set1_pd(INV_LN2_N), _mm512_cvtps_pd(x));
    let kd = _mm512_add_pd(z, shift);
    let ki = _mm512_castpd_si512(kd);
    let r = _mm512_sub_pd(z, _mm512_sub_pd(kd, shift));
    // Index bits 0..3 pick among sixteen entries of a register pair; bit 4 picks the pair.
    let lo = _mm512_permutex2var_epi64(tab[0], ki, tab[1]);
    let hi = _mm512_permutex2var_epi64(tab[2], ki, tab[3]);
    let upper = _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16));
    let t = _mm512_mask_blend_epi64(upper, lo, hi);
    let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
    let p = _mm512_fmadd_pd(_mm512_set1_pd(C0), r, _mm512_set1_pd(C1));
    let y = _mm512_fmadd_pd(_mm512_set1_pd(C2), r, _mm512_set1_pd(1.0));
    let y = _mm512_fmadd_pd(p, _mm512_mul_pd(r, r), y);
    _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
}

/// Sixteen lanes of `expf`; lanes with special inputs go to `f32::exp`.
#[inline]
#[target_feature(enable = "avx512f")]
fn exp16(x: __m512, tab: &[__m512i; 4]) -> __m512 {
    // |x| >= 88, infinities and NaN: the top 12 bits without the sign at or above 88's.
    let top = _mm512_and_si512(
        _mm512_srli_epi32::<20>(_mm512_castps_si512(x)),
        _mm512_set1_epi32(0x7ff),
    );
    let big = _mm512_cmpgt_epi32_mask(top, _mm512_set1_epi32((88f32.to_bits() >> 20) as i32 - 1));
    let lo = exp8d(_mm512_castps512_ps256(x), tab);
    // (The 64-bit-lane forms of extract and insert move the same bits and need only F.)
    let hi = exp8d(
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(x))),
        tab,
    );
    let e = _mm512_castpd_ps(_mm512_insertf64x4::<1>(
        _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
        _mm256_castps_pd(hi),
    ));
    if big == 0 {
        return e;
    }
    let (mut v, mut xs) = ([0.0f32; 16], [0.0f32; 16]);
    // SAFETY: both arrays hold sixteen f32.
    unsafe {
        _mm512_storeu_ps(v.as_mut_ptr(), e);
        _mm512_storeu_ps(xs.as_mut_ptr(), x);
    }
    fix_special(&mut v, &xs);
    // SAFETY: as above.
    unsafe { _mm512_loadu_ps(v.as_ptr()) }
}

/// `s[i] = expf(s[i] - mx)` for the values of whole chunks of sixteen; returns how many
/// it did (the caller takes the rest).
///
/// # Safety
/// AVX-512 F must be available.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn exp_sub(s: &mut [f32], mx: f32) -> usize {
    let (n, p) = (s.len(), s.as_mut_ptr());
    let (m, tab) = (_mm512_set1_ps(mx), table());
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n values of `s`.
        unsafe {
            let x = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m);
            _mm512_storeu_ps(p.add(i), exp16(x, &tab));
        }
        i += 16;
    }
    i
}

/// `out[i] = silu(gate[i]) * up[i]`, rounded as the scalar code rounds it, for the
/// values of whole chunks of sixteen; returns how many it did (the caller takes the rest).
///
/// # Safety
/// AVX-512 F must be available; the slices have equal lengths.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn swiglu(gate: &[f32], up: &[f32], out: &mut [f32]) -> usize {
    let (n, tab) = (out.len(), table());
    let one = _mm512_set1_ps(1.0);
    let mut i = 0;
    while i + 16 <= n {
        // SAFETY: i + 16 <= n values of each slice.
        unsafe {
            let g = _mm512_loadu_ps(gate.as_ptr().add(i));
            let e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), g), &tab);
            let s = _mm512_div_ps(g, _mm512_add_ps(one, e));
            let y = _mm512_mul_ps(s, _mm512_loadu_ps(up.as_ptr().add(i)));
            _mm512_storeu_ps(out.as_mut_ptr().add(i), y);
        }
        i += 16;
    }
    i
}

#[cfg(test)]
mod tests {
    use super::super::exp::{exp_sub_scalar, swiglu_scalar};
    use minfer_testkit::Rng;

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// Every lane gives the scalar reference's bits, with special inputs (|x| >= 88,
    /// infinities, NaN) spread over the sixteen-lane chunks and the tail.
    #[test]
    fn lanes_give_the_scalar_bits() {
        if !super::super::vec512::enabled() {
            return;
        }
        let mut r = Rng::new(23);
        let mut xs: Vec<f32> = (0..1000).map(|_| r.f32() * 60.0 - 30.0).collect();
        let specials = [
            -87.9,
            -88.0,
            -103.9,
            f32::NEG_INFINITY,
            f32::NAN,
            90.0,
            88.5,
            -0.0,
        ];
        for (i, s) in specials.iter().enumerate() {
            xs[37 * i + 5] = *s;
        }
        for n in [0, 15, 16, 17, 1000] {
            for mx in [0.0f32, 3.5] {
                let (mut a, mut b) = (xs[..n].to_vec(), xs[..n].to_vec());
                exp_sub_scalar(&mut a, mx);
                // SAFETY: `enabled` implies AVX-512 F.
                let done = unsafe { super::exp_sub(&mut b, mx) };
                assert_eq!(done, n / 16 * 16);
                exp_sub_scalar(&mut b[done..], mx);
                assert_eq!(bits(&a), bits(&b), "n {n} mx {mx}");
            }
            let up: Vec<f32> = (0..n).map(|_| r.f32()).collect();
            let gate: Vec<f32> = xs[..n].iter().map(|x| x.clamp(-100.0, 100.0)).collect();
            let (mut a, mut b) = (vec![0.0; n], vec![0.0; n]);
            swiglu_scalar(&gate, &up, &mut a);
            // SAFETY: as above; equal lengths.
            let done = unsafe { super::swiglu(&gate, &up, &mut b) };
            swiglu_scalar(&gate[done..], &up[done..], &mut b[done..]);
            assert_eq!(bits(&a), bits(&b), "swiglu n {n}");
        }
    }
}
