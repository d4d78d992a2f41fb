//! Packed K/V rows back to f32 for attention, a head of a tile of keys at a time: the
//! portable loops, and AVX2 + F16C kernels that widen 8 or 32 values per step where
//! the CPU has them (detected at run time). Every conversion here is exact (f16 → f32,
//! i8 → f32) or one f32 multiply (`q * d`), so both paths give the same bits.

use minfer_graph::kvtype::{Q8_0_BLOCK, Q8_0_BLOCK_BYTES};
use minfer_graph::KvType;

/// Where a head's values sit in a packed region: rows of `row_bytes`, the head's bytes
/// at `[off, off + len)` of each row.
#[derive(Debug, Clone, Copy)]
pub struct HeadBytes {
    /// Bytes per region row.
    pub row_bytes: usize,
    /// The head's first byte in a row.
    pub off: usize,
    /// The head's bytes (whole blocks of the format).
    pub len: usize,
}

/// Decodes the head of region rows `first..first + n` of format `t` from `region` into
/// `dst`, one row of `dst.len() / n` values after the other: a tile of keys or values in
/// one call, so the kernel's setup is paid once per tile rather than once per row.
/// Infallible for the geometry attention validates (rows past `region` are not decoded).
pub fn decode_rows(
    t: KvType,
    region: &[u8],
    h: HeadBytes,
    first: usize,
    n: usize,
    dst: &mut [f32],
) {
    if n == 0 {
        return;
    }
    let hd = dst.len() / n;
    let rows = dst.chunks_exact_mut(hd).enumerate();
    #[cfg(target_arch = "x86_64")]
    if t != KvType::F32 && has_f16c() {
        // SAFETY: AVX2 and F16C were detected.
        unsafe { x86::decode_rows(t, region, h, first, hd, dst) };
        return;
    }
    for (i, y) in rows {
        let at = (first + i) * h.row_bytes + h.off;
        if let Some(src) = region.get(at..at + h.len) {
            decode_portable(t, src, y);
        }
    }
}

/// Decodes `dst.len()` elements of a packed format (whole blocks) from `src` (a shorter
/// `src` decodes fewer).
#[inline]
pub fn decode_packed(t: KvType, src: &[u8], dst: &mut [f32]) {
    let h = HeadBytes {
        row_bytes: src.len(),
        off: 0,
        len: src.len(),
    };
    decode_rows(t, src, h, 0, 1, dst);
}

/// Whether this CPU runs the x86 kernels (std caches the detection).
#[cfg(target_arch = "x86_64")]
#[inline]
fn has_f16c() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c")
}

/// The reference loops (the compiler vectorises the F32 and Q8_0 ones).
pub(crate) fn decode_portable(t: KvType, src: &[u8], dst: &mut [f32]) {
    match t {
        KvType::F32 => {
            for (b, y) in src.chunks_exact(4).zip(dst) {
                *y = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        KvType::F16 => {
            for (b, y) in src.chunks_exact(2).zip(dst) {
                *y = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        KvType::Q8_0 => {
            for (b, y) in src
                .chunks_exact(Q8_0_BLOCK_BYTES)
                .zip(dst.chunks_exact_mut(Q8_0_BLOCK))
            {
                let d = f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]]));
                for (q, y) in b[2..].iter().zip(y) {
                    *y = f32::from(*q as i8) * d;
                }
            }
        }
    }
}

#[inline]
fn f16_bits_to_f32(h: u16) -> f32 {
    half::f16::from_bits(h).to_f32()
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    use super::{
        decode_portable, f16_bits_to_f32, HeadBytes, KvType, Q8_0_BLOCK, Q8_0_BLOCK_BYTES,
    };

    /// [`super::decode_rows`] for F16 and Q8_0, rows of `hd` values.
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    pub(super) unsafe fn decode_rows(
        t: KvType,
        region: &[u8],
        h: HeadBytes,
        first: usize,
        hd: usize,
        dst: &mut [f32],
    ) {
        for (i, y) in dst.chunks_exact_mut(hd).enumerate() {
            let at = (first + i) * h.row_bytes + h.off;
            if let Some(src) = region.get(at..at + h.len) {
                // SAFETY: the features are this function's own.
                unsafe { decode(t, src, y) };
            }
        }
    }

    /// One row's head: F16 and Q8_0 (F32 takes the portable loop).
    ///
    /// # Safety
    /// The CPU has AVX2 and F16C.
    #[target_feature(enable = "avx2,f16c")]
    #[inline]
    unsafe fn decode(t: KvType, src: &[u8], dst: &mut [f32]) {
        match t {
            KvType::F16 => {
                let n = (src.len() / 2).min(dst.len());
                let n8 = n / 8 * 8;
                let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
                for i in (0..n8).step_by(8) {
                    // SAFETY: i + 8 <= n, within both slices (16 bytes of src, 8 of dst).
                    unsafe {
                        let h = _mm_loadu_si128(s.add(2 * i).cast());
                        _mm256_storeu_ps(d.add(i), _mm256_cvtph_ps(h));
                    }
                }
                decode_portable(t, &src[2 * n8..2 * n], &mut dst[n8..n]);
            }
            KvType::Q8_0 => {
                for (b, y) in src
                    .chunks_exact(Q8_0_BLOCK_BYTES)
                    .zip(dst.chunks_exact_mut(Q8_0_BLOCK))
                {
                    let d = _mm256_set1_ps(f16_bits_to_f32(u16::from_le_bytes([b[0], b[1]])));
                    let (q, o) = (b[2..].as_ptr(), y.as_mut_ptr());
                    for j in (0..Q8_0_BLOCK).step_by(8) {
                        // SAFETY: a block holds 32 quants after its scale, and `y` 32
                        // values; 8 bytes are read and 8 floats written at j < 32.
                        unsafe {
                            let w = _mm_loadl_epi64(q.add(j).cast());
                            let f = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(w));
                            _mm256_storeu_ps(o.add(j), _mm256_mul_ps(f, d));
                        }
                    }
                }
            }
            KvType::F32 => decode_portable(t, src, dst),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every f16 bit pattern but NaNs, and Q8_0 blocks with extreme scales and quants:
    /// the fast path's bits equal the portable loops', with odd lengths for the tails.
    #[test]
    fn the_fast_decode_is_the_portable_bits() {
        let halves: Vec<u16> = (0..=u16::MAX)
            .filter(|&h| !half::f16::from_bits(h).is_nan())
            .collect();
        let bytes: Vec<u8> = halves.iter().flat_map(|h| h.to_le_bytes()).collect();
        for n in [halves.len(), 13, 8, 7] {
            let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
            decode_packed(KvType::F16, &bytes[..2 * n], &mut a);
            decode_portable(KvType::F16, &bytes[..2 * n], &mut b);
            assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
        }
        let scales = [0x0001u16, 0x3c00, 0x7bff, 0xbc00, 0x0400, 0x2e66];
        let mut q8 = Vec::new();
        for (i, s) in scales.iter().enumerate() {
            q8.extend_from_slice(&s.to_le_bytes());
            q8.extend((0..32).map(|j| ((j * 37 + i * 11) as u8).wrapping_sub(128)));
        }
        let n = scales.len() * Q8_0_BLOCK;
        let (mut a, mut b) = (vec![0f32; n], vec![1f32; n]);
        decode_packed(KvType::Q8_0, &q8, &mut a);
        decode_portable(KvType::Q8_0, &q8, &mut b);
        assert!(a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits()));
    }
}
