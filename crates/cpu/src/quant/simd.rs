//! AVX2 helpers shared by the kernels. Every function requires AVX2, FMA and F16C, which
//! callers guarantee by being `#[target_feature]` functions reached only through a
//! detected [`super::Isa`].

use std::arch::x86_64::*;

/// Widens one f16 bit pattern with F16C (exact, like `half::f16::to_f32`).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn f16_to_f32(bits: u16) -> f32 {
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)))
}

/// Sums eight f32 lanes as `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, the order
/// [`super::hsum8_fixed`] replays.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_ps(v: __m256) -> f32 {
    let s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)))
}

/// Sums eight i32 lanes (exact up to wrap-around, which the callers' ranges exclude).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    let s = _mm_add_epi32(s, _mm_unpackhi_epi64(s, s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 1));
    _mm_cvtsi128_si32(s)
}

/// Expands 32 bits into 32 bytes: byte `j` is 0xFF when bit `j` is set, else 0.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn bytes_from_bits_32(bits: u32) -> __m256i {
    let v = _mm256_set1_epi32(bits as i32);
    // Byte j takes source byte j / 8.
    let spread = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let v = _mm256_shuffle_epi8(v, spread);
    // Byte k of each group has every bit but bit k set; OR-ing leaves all ones iff bit k was.
    let others = _mm256_set1_epi64x(0x7fbf_dfef_f7fb_fdfe);
    _mm256_cmpeq_epi8(_mm256_or_si256(v, others), _mm256_set1_epi8(-1))
}

/// Splits 16 packed bytes into 32 nibbles: low nibbles in bytes 0..16, high in 16..32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibbles_16(qs: &[u8; 16]) -> __m256i {
    // SAFETY (of the load): `qs` is 16 readable bytes; loadu has no alignment need.
    let q = _mm_loadu_si128(qs.as_ptr().cast());
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(q, mask);
    let hi = _mm_and_si128(_mm_srli_epi16(q, 4), mask);
    _mm256_set_m128i(hi, lo)
}

/// Loads 32 bytes from a 32-byte array.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn load32<T>(p: &[T; 32]) -> __m256i
where
    T: Copy,
{
    debug_assert_eq!(std::mem::size_of::<T>(), 1);
    _mm256_loadu_si256(p.as_ptr().cast())
}

/// `Σ a_i * b_i` over byte pairs into eight i32 lanes (lane `l` takes bytes `4l..4l+4`),
/// with `a` unsigned and `b` signed; exact while pair sums fit in i16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn dot_u8i8_epi32(a: __m256i, b: __m256i) -> __m256i {
    _mm256_madd_epi16(_mm256_maddubs_epi16(a, b), _mm256_set1_epi16(1))
}

/// How far ahead of the tile or block being read the weight kernels prefetch their
/// stream when they run one token. Decode is bound by the read bandwidth one core draws,
/// and the hardware prefetchers alone keep too few lines in flight: prefetching 8 KiB
/// ahead streamed 8% to 25% faster (paired laps over 512 MiB of 8960x1536 weights, Q4_K
/// and Q5_0 tiles, AVX2 and VNNI kernels, 2 threads; 4 KiB gave 6% to 17%). Calls for
/// several tokens are compute-bound and re-read their weights from cache; there the extra
/// requests cost up to 12% of AVX2 prefill, so they prefetch nothing.
const PREFETCH_AHEAD: usize = 8192;

/// In a kernel call for `NT` tokens: for one token, prefetches into L1 the
/// `size_of::<T>()` bytes that lie [`PREFETCH_AHEAD`] bytes past `p`, one request per cache
/// line; otherwise nothing. The address may lie outside any allocation (past a matrix's
/// end): it is never dereferenced.
#[inline(always)]
pub(super) fn prefetch_ahead<const NT: usize, T>(p: *const T) {
    if NT != 1 {
        return;
    }
    let base = p.cast::<i8>().wrapping_add(PREFETCH_AHEAD);
    let mut off = 0;
    while off < std::mem::size_of::<T>() {
        // SAFETY: a prefetch is a hint that never faults, whatever the address.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(off)) };
        off += 64;
    }
}
