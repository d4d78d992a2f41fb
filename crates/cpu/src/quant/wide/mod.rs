//! The 512-bit VNNI tile kernels: two row groups (sixteen output rows) per call, the first
//! group in the low 256 bits of every register and the second in the high ones. The
//! 32-element types (Q8_0, Q5_0, IQ4_NL) are here, the super-block types in `kquant`.
//!
//! Where a core runs 512-bit `vpdpbusd` on two ports (Intel server cores), a 512-bit
//! instruction does twice the multiply-adds of a 256-bit one at the same rate, so the
//! prefill tiles run up to twice as fast; where 512-bit operations are split in two
//! (AMD Zen 4) they cost what two 256-bit ones do. Every lane runs the steps of the
//! 256-bit VNNI kernel of its group (exact per-block integer sums, then the same float
//! steps in the same order), so each output is the same bits as there, and as the scalar
//! reference's.
//!
//! Q8_0 levels enter `vpdpbusd` as unsigned bytes `w + 128` (a flipped sign bit), with
//! `128 · Σ y` taken off the block's sum: one instruction per four columns and token
//! instead of the sign trick's two.

use super::repack::{Act, TileQ5, TileQ8};
use super::repack_nl::TileIq4Nl;
use minfer_gguf::quant::KVALUES_IQ4NL;
use std::arch::x86_64::*;

mod kquant;
pub(crate) use kquant::gemv_wide_k;

/// A 32-element tile type with a two-group kernel here.
pub(crate) trait Wide32: Sized {
    /// The sixteen row results of `w0` then `w1` per token.
    ///
    /// # Safety
    /// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI; `w1` and every activation row hold at
    /// least `w0.len()` blocks.
    unsafe fn gemv2<const NT: usize>(w0: &[Self], w1: &[Self], y: [Act<'_>; NT])
        -> [[f32; 16]; NT];
}

impl Wide32 for TileQ8 {
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [Act<'_>; NT],
    ) -> [[f32; 16]; NT] {
        // SAFETY: as the caller guarantees.
        unsafe { gemv2_q8(w0, w1, y) }
    }
}

impl Wide32 for TileQ5 {
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [Act<'_>; NT],
    ) -> [[f32; 16]; NT] {
        // SAFETY: as the caller guarantees.
        unsafe { gemv2_q5(w0, w1, y) }
    }
}

impl Wide32 for TileIq4Nl {
    unsafe fn gemv2<const NT: usize>(
        w0: &[Self],
        w1: &[Self],
        y: [Act<'_>; NT],
    ) -> [[f32; 16]; NT] {
        // SAFETY: as the caller guarantees.
        unsafe { gemv2_iq4nl(w0, w1, y) }
    }
}

/// Proof that the two-group kernels may run: the kernels' ISA is the VNNI one, detected
/// at run time (AVX-512 F/BW/VL/VNNI among its features).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Wide(());

/// [`Wide`] where `isa` is the VNNI one; `None` otherwise (the callers then keep the
/// one-group kernels).
pub(crate) fn wide(isa: super::Isa) -> Option<Wide> {
    matches!(isa.0, super::IsaKind::Vnni).then_some(Wide(()))
}

/// The two-group kernel of `T`: bitwise two calls of its one-group VNNI kernel. Panics
/// when `w1` or an activation row is shorter than `w0`.
#[inline]
pub(crate) fn gemv_wide<T: Wide32, const NT: usize>(
    _: Wide,
    w0: &[T],
    w1: &[T],
    y: [Act<'_>; NT],
) -> [[f32; 16]; NT] {
    // SAFETY: a `Wide` exists only after runtime detection of the kernels' features; the
    // kernels slice `w1` and the activations to `w0`'s length (panicking when shorter).
    unsafe { T::gemv2(w0, w1, y) }
}

/// The 32 bytes at `a` in the low half and the 32 at `b` in the high half.
///
/// # Safety
/// 32 readable bytes at each pointer; AVX-512 F.
#[inline]
#[target_feature(enable = "avx2,avx512f")]
pub(super) unsafe fn join(a: *const u8, b: *const u8) -> __m512i {
    // SAFETY: the caller guarantees 32 readable bytes at each; unaligned loads.
    unsafe {
        _mm512_inserti64x4::<1>(
            _mm512_castsi256_si512(_mm256_loadu_si256(a.cast())),
            _mm256_loadu_si256(b.cast()),
        )
    }
}

/// The sixteen row scales (f16 bits) of two tiles as f32.
#[inline]
#[target_feature(enable = "avx2,f16c,avx512f")]
pub(super) fn scales(d0: &[u16; 8], d1: &[u16; 8]) -> __m512 {
    // SAFETY: each array is 16 bytes.
    let (a, b) = unsafe {
        (
            _mm_loadu_si128(d0.as_ptr().cast()),
            _mm_loadu_si128(d1.as_ptr().cast()),
        )
    };
    _mm512_cvtph_ps(_mm256_set_m128i(b, a))
}

/// The four activation bytes at `p`, broadcast to every i32 lane.
///
/// # Safety
/// Four readable bytes at `p`; AVX-512 F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn bcast4(p: *const i8) -> __m512i {
    // SAFETY: the caller guarantees four readable bytes; unaligned read.
    _mm512_set1_epi32(unsafe { p.cast::<i32>().read_unaligned() })
}

/// The integer chain of register `k` for `NT` tokens: two chains (even and odd `k`) keep
/// enough independent sums in flight for up to four tokens; eight tokens have enough
/// with one each, and need the registers. Integer sums are exact, so the split changes no
/// bit.
#[inline(always)]
const fn chain<const NT: usize>(k: usize) -> usize {
    if NT >= 8 {
        0
    } else {
        k % 2
    }
}

/// Stores the accumulators as sixteen row results per token.
#[inline]
#[target_feature(enable = "avx512f")]
pub(super) fn store<const NT: usize>(acc: [__m512; NT]) -> [[f32; 16]; NT] {
    let mut out = [[0.0f32; 16]; NT];
    for t in 0..NT {
        // SAFETY: `out[t]` holds sixteen f32.
        unsafe { _mm512_storeu_ps(out[t].as_mut_ptr(), acc[t]) };
    }
    out
}

/// The integer chains of `NT` tokens for one block, the first of each starting at
/// `-off` (the block's level shift times `Σ y`) so that no subtraction follows: integer
/// sums are exact, so the bits are those of subtracting at the end.
#[inline(always)]
fn chains<const NT: usize>(off: impl Fn(usize) -> i32) -> [[__m512i; 2]; NT] {
    // SAFETY: plain register arithmetic; the callers run with AVX-512 F enabled.
    std::array::from_fn(|t| unsafe {
        [
            _mm512_set1_epi32(off(t).wrapping_neg()),
            _mm512_setzero_si512(),
        ]
    })
}

/// `acc += (dw · dy) · (s0 + s1)` per lane, the 256-bit kernels' float step (the chains
/// already hold the offset; see [`chains`]).
#[inline(always)]
fn scale_acc(acc: __m512, dw: __m512, s: [__m512i; 2], dy: f32) -> __m512 {
    // SAFETY: plain register arithmetic; the callers run with AVX-512 F enabled.
    unsafe {
        let s = _mm512_add_epi32(s[0], s[1]);
        let d = _mm512_mul_ps(dw, _mm512_set1_ps(dy));
        _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(s), acc)
    }
}

/// Q8_0 tiles `w0` and `w1` (two row groups, the same blocks) against `NT` activation
/// rows: the sixteen row results per token, bitwise those of the 256-bit kernels.
///
/// # Safety
/// AVX2/FMA/F16C and AVX-512 F/BW/VL/VNNI; `w0`, `w1` and every activation row hold at
/// least `w0.len()` blocks.
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv2_q8<const NT: usize>(
    w0: &[TileQ8],
    w1: &[TileQ8],
    y: [Act<'_>; NT],
) -> [[f32; 16]; NT] {
    let n = w0.len();
    let (w1, y) = (&w1[..n], y.map(|a| (&a.q[..n], &a.d[..n], &a.s[..n])));
    let flip = _mm512_set1_epi8(i8::MIN);
    let mut acc = [_mm512_setzero_ps(); NT];
    for (b, (t0, t1)) in w0.iter().zip(w1).enumerate() {
        let dw = scales(&t0.d, &t1.d);
        let mut sum = chains::<NT>(|t| 128 * y[t].2[b]);
        for k in 0..8 {
            // SAFETY: register k is bytes 32k..32k+32 of each tile's 256.
            let wk = unsafe {
                join(
                    t0.qs.as_ptr().add(32 * k).cast(),
                    t1.qs.as_ptr().add(32 * k).cast(),
                )
            };
            let uk = _mm512_xor_si512(wk, flip);
            for t in 0..NT {
                // SAFETY: 4k + 4 <= 32 bytes of the block's levels.
                let yk = unsafe { bcast4(y[t].0[b].qs.as_ptr().add(4 * k)) };
                let s = &mut sum[t][chain::<NT>(k)];
                *s = _mm512_dpbusd_epi32(*s, uk, yk);
            }
        }
        for t in 0..NT {
            acc[t] = scale_acc(acc[t], dw, sum[t], y[t].1[b]);
        }
    }
    store(acc)
}

/// Two Q5_0 tiles' unsigned levels `q + 16` as eight registers, laid out as
/// [`TileQ5::unpack_avx2`]'s, the first tile in the low halves.
#[inline]
#[target_feature(enable = "avx2,avx512f,avx512bw")]
fn unpack_q5(t0: &TileQ5, t1: &TileQ5) -> [__m512i; 8] {
    let (m4, b4) = (_mm512_set1_epi8(0x0f), _mm512_set1_epi8(0x10));
    // SAFETY: `hb` is 32 bytes in each tile.
    let h = unsafe { join(t0.hb.as_ptr(), t1.hb.as_ptr()) };
    // Bit k of each byte moved to bit 4 (16-bit shifts by at most 4 keep it in its byte).
    let hi = [
        _mm512_and_si512(_mm512_slli_epi16::<4>(h), b4),
        _mm512_and_si512(_mm512_slli_epi16::<3>(h), b4),
        _mm512_and_si512(_mm512_slli_epi16::<2>(h), b4),
        _mm512_and_si512(_mm512_slli_epi16::<1>(h), b4),
        _mm512_and_si512(h, b4),
        _mm512_and_si512(_mm512_srli_epi16::<1>(h), b4),
        _mm512_and_si512(_mm512_srli_epi16::<2>(h), b4),
        _mm512_and_si512(_mm512_srli_epi16::<3>(h), b4),
    ];
    let mut u = [_mm512_setzero_si512(); 8];
    for m in 0..4 {
        // SAFETY: 32 bytes at 32m + 32 <= 128 of each tile's `nib`.
        let n = unsafe { join(t0.nib.as_ptr().add(32 * m), t1.nib.as_ptr().add(32 * m)) };
        // (n & m4) | hi, one ternary-logic instruction (0xEA: (a & b) | c).
        u[2 * m] = _mm512_ternarylogic_epi32::<0xEA>(n, m4, hi[2 * m]);
        u[2 * m + 1] =
            _mm512_ternarylogic_epi32::<0xEA>(_mm512_srli_epi16::<4>(n), m4, hi[2 * m + 1]);
    }
    u
}

/// Q5_0 tiles `w0` and `w1` against `NT` activation rows, as [`gemv2_q8`].
///
/// # Safety
/// As [`gemv2_q8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv2_q5<const NT: usize>(
    w0: &[TileQ5],
    w1: &[TileQ5],
    y: [Act<'_>; NT],
) -> [[f32; 16]; NT] {
    let n = w0.len();
    let (w1, y) = (&w1[..n], y.map(|a| (&a.q[..n], &a.d[..n], &a.s[..n])));
    let mut acc = [_mm512_setzero_ps(); NT];
    for (b, (t0, t1)) in w0.iter().zip(w1).enumerate() {
        let dw = scales(&t0.d, &t1.d);
        let u = unpack_q5(t0, t1);
        let mut sum = chains::<NT>(|t| 16 * y[t].2[b]);
        for (k, uk) in u.iter().enumerate() {
            for t in 0..NT {
                // SAFETY: 4k + 4 <= 32 bytes of the block's levels.
                let yk = unsafe { bcast4(y[t].0[b].qs.as_ptr().add(4 * k)) };
                let s = &mut sum[t][chain::<NT>(k)];
                *s = _mm512_dpbusd_epi32(*s, *uk, yk);
            }
        }
        for t in 0..NT {
            acc[t] = scale_acc(acc[t], dw, sum[t], y[t].1[b]);
        }
    }
    store(acc)
}

/// IQ4_NL tiles `w0` and `w1` against `NT` activation rows, as [`gemv2_q8`] (the steps of
/// `repack_nl`'s VNNI kernel: levels `K + 128` by byte shuffle, `128 · Σ y` taken off).
///
/// # Safety
/// As [`gemv2_q8`].
#[inline]
#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn gemv2_iq4nl<const NT: usize>(
    w0: &[TileIq4Nl],
    w1: &[TileIq4Nl],
    y: [Act<'_>; NT],
) -> [[f32; 16]; NT] {
    let n = w0.len();
    let (w1, y) = (&w1[..n], y.map(|a| (&a.q[..n], &a.d[..n], &a.s[..n])));
    let shifted: [u8; 16] = KVALUES_IQ4NL.map(|k| (k as i32 + 128) as u8);
    // SAFETY: 16 bytes.
    let table = _mm512_broadcast_i32x4(unsafe { _mm_loadu_si128(shifted.as_ptr().cast()) });
    let m4 = _mm512_set1_epi8(0x0f);
    let mut acc = [_mm512_setzero_ps(); NT];
    for (b, (t0, t1)) in w0.iter().zip(w1).enumerate() {
        let dw = scales(&t0.d, &t1.d);
        let mut u = [_mm512_setzero_si512(); 8];
        for m in 0..4 {
            // SAFETY: 32 bytes at 32m + 32 <= 128 of each tile's `nib`.
            let q = unsafe { join(t0.nib.as_ptr().add(32 * m), t1.nib.as_ptr().add(32 * m)) };
            u[2 * m] = _mm512_shuffle_epi8(table, _mm512_and_si512(q, m4));
            u[2 * m + 1] =
                _mm512_shuffle_epi8(table, _mm512_and_si512(_mm512_srli_epi16::<4>(q), m4));
        }
        let mut sum = chains::<NT>(|t| 128 * y[t].2[b]);
        for (k, uk) in u.iter().enumerate() {
            for t in 0..NT {
                // SAFETY: 4k + 4 <= 32 bytes of the block's levels.
                let yk = unsafe { bcast4(y[t].0[b].qs.as_ptr().add(4 * k)) };
                let s = &mut sum[t][chain::<NT>(k)];
                *s = _mm512_dpbusd_epi32(*s, *uk, yk);
            }
        }
        for t in 0..NT {
            acc[t] = scale_acc(acc[t], dw, sum[t], y[t].1[b]);
        }
    }
    store(acc)
}

/// Sum over registers `ks` of `u[k] · y[4k..4k+4]` per i32 lane in two chains (even and
/// odd `k`), as `quant::vnni::dot_regs` sums them.
///
/// # Safety
/// `qs` points at `4 * ks.end` readable bytes.
#[inline(always)]
pub(super) unsafe fn dot2(u: &[__m512i; 8], qs: *const i8, ks: std::ops::Range<usize>) -> __m512i {
    // SAFETY: the callers run with AVX-512 F/VNNI enabled; 4k + 4 <= 4 * ks.end bytes.
    unsafe {
        let mut s = [_mm512_setzero_si512(); 2];
        for k in ks {
            s[k % 2] = _mm512_dpbusd_epi32(s[k % 2], u[k], bcast4(qs.add(4 * k)));
        }
        _mm512_add_epi32(s[0], s[1])
    }
}
