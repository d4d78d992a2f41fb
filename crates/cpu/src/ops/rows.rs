//! Key and value rows as the x86 attention kernels read them: f32 rows of a region or a
//! decoded tile, or F16 and Q8_0 rows of a packed region widened in registers as they are
//! loaded. A load gives the values decoding would have written (both widenings are exact,
//! and a Q8_0 value is the one product `q * d`), so a kernel computes the same bits over
//! packed rows as over their decoded copy, without writing and re-reading that copy.
//!
//! Row `i` of a view is the `i`-th row of the call (the view holds the first row and the
//! stride); columns are elements of the head, in whole groups of 8 (16 for `load16`).

use std::arch::x86_64::*;

use minfer_graph::kvtype::{Q8_0_BLOCK, Q8_0_BLOCK_BYTES};

/// How many rows ahead of the one they compute the attention kernels ask for key and
/// value rows ([`Rows::prefetch`]). A decode token's item reads each row of its KV head
/// once, in short runs (a head's part of a row is 8 cache lines of f16 for a 256-wide
/// head, 4 of f32 for a 64-wide one, then the other heads' part), which the hardware
/// prefetchers barely train on, so without the hint the kernels wait on memory and
/// compute in turn. With it, decode attention after 4096 tokens took about 30% less
/// time over f16, 45% less over Q8_0 and 14% less over f32 (two threads, AVX-512 host,
/// BENCHMARKS.md); in the model 16 rows gained less and 64 no more, and in
/// `examples/attn_decode` 128 gained less.
pub(crate) const PREFETCH_ROWS: usize = 32;

/// A view of rows the kernels load 8 or 16 values at a time from.
///
/// # Safety
/// Implementors load only inside the rows the view was made for; callers pass rows and
/// columns inside the view (`col + 8`, or `col + 16`, at most the head size) and run
/// with AVX2, FMA and F16C enabled (AVX-512 F for `load16`).
pub(crate) unsafe trait Rows: Copy {
    /// Whether [`Self::load32`] and [`Self::load32_both`] share work between the loads
    /// of a block (a Q8_0 block's scale): the kernels take a row's block at once only
    /// then, since for f32 rows the regrouped loop ran slower (prefill's 4096-token
    /// attention about 8%).
    const BLOCK_LOADS: bool = false;

    /// How many rows the view holds, each readable at [`Self::width`] values.
    fn rows(self) -> usize;

    /// The values of a row the view can read.
    fn width(self) -> usize;

    /// Rows `row0..row0 + rows` of this view as a view of their own.
    ///
    /// # Panics
    /// Where they are not all in this view (a caller's bug).
    fn sub(self, row0: usize, rows: usize) -> Self;

    /// Asks the cache for the lines holding values `col..col + n` of row `row`, which
    /// may lie past the view (the next tile's rows).
    fn prefetch(self, row: usize, col: usize, n: usize);

    /// Values `col..col + 8` of row `row`.
    ///
    /// # Safety
    /// As the trait says.
    unsafe fn load8(self, row: usize, col: usize) -> __m256;

    /// Values `col..col + 16` of row `row` (`col` a multiple of 16).
    ///
    /// # Safety
    /// As the trait says.
    unsafe fn load16(self, row: usize, col: usize) -> __m512;

    /// Values `col..col + 32` of row `row`, eight per register (`col` a multiple of 32):
    /// the four [`Self::load8`] of the block, which a packed view can widen sharing one
    /// scale.
    ///
    /// # Safety
    /// As the trait says, for `col + 32`.
    #[inline(always)]
    unsafe fn load32(self, row: usize, col: usize) -> [__m256; 4] {
        // SAFETY: as the trait says.
        std::array::from_fn(|j| unsafe { self.load8(row, col + 8 * j) })
    }

    /// Values `col..col + 64` of row `row`, sixteen per register (`col` a multiple of
    /// 64): the four [`Self::load16`] of the chunk.
    ///
    /// # Safety
    /// As the trait says, for `col + 64`.
    #[inline(always)]
    unsafe fn load64(self, row: usize, col: usize) -> [__m512; 4] {
        // SAFETY: as the trait says.
        std::array::from_fn(|j| unsafe { self.load16(row, col + 16 * j) })
    }

    /// Values `col..col + 32` of row `row`, each group of eight in both 256-bit halves
    /// of its register (`col` a multiple of 32): the four [`Self::load8_both`].
    ///
    /// # Safety
    /// As the trait says, for `col + 32`.
    #[inline(always)]
    unsafe fn load32_both(self, row: usize, col: usize) -> [__m512; 4] {
        // SAFETY: as the trait says.
        std::array::from_fn(|j| unsafe { self.load8_both(row, col + 8 * j) })
    }

    /// Values `col..col + 8` of row `row` in both 256-bit halves.
    ///
    /// # Safety
    /// As the trait says.
    #[inline(always)]
    unsafe fn load8_both(self, row: usize, col: usize) -> __m512 {
        // SAFETY: as the trait says.
        unsafe {
            _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_castps_pd(
                self.load8(row, col),
            )))
        }
    }
}

/// f32 rows: row `i` starts at element `first + i * stride` of `ptr`.
#[derive(Clone, Copy)]
pub(crate) struct F32Rows {
    ptr: *const f32,
    stride: usize,
    first: usize,
    rows: usize,
    width: usize,
}

impl F32Rows {
    /// Rows `first + i * stride` (`i < rows`) of `data`, `width` values each.
    ///
    /// # Panics
    /// Where a row lies outside `data`: the callers check their shapes first, so this is
    /// a bug in the caller, not bad input.
    #[inline(always)]
    pub fn new(data: &[f32], stride: usize, first: usize, rows: usize, width: usize) -> F32Rows {
        assert!(
            inside(data.len(), stride, first, rows, width),
            "f32 rows out of bounds"
        );
        F32Rows {
            ptr: data.as_ptr(),
            stride,
            first,
            rows,
            width,
        }
    }
}

/// Asks the cache for every line of the bytes `[a, b)`, wherever they are: a prefetch
/// is a hint that reads nothing architecturally and never faults, so an address past
/// the region (the rows after its last, named by a kernel's look-ahead) costs a useless
/// line at most.
#[inline(always)]
fn prefetch_span(a: *const u8, b: *const u8) {
    let (mut line, end) = (a as usize & !63, b as usize);
    while line < end {
        // SAFETY: a prefetch instruction, as above: no access is made.
        unsafe { _mm_prefetch::<_MM_HINT_T0>(line as *const i8) };
        line += 64;
    }
}

/// Whether rows `first + i * stride .. + width` for `i < rows` lie inside `len` units.
#[inline(always)]
fn inside(len: usize, stride: usize, first: usize, rows: usize, width: usize) -> bool {
    let end = rows.checked_sub(1).map_or(Some(0), |last| {
        last.checked_mul(stride)?
            .checked_add(first)?
            .checked_add(width)
    });
    end.is_some_and(|e| e <= len)
}

// SAFETY: loads at `first + row * stride + col`, inside the rows the caller names.
unsafe impl Rows for F32Rows {
    #[inline(always)]
    fn rows(self) -> usize {
        self.rows
    }

    #[inline(always)]
    fn sub(self, row0: usize, rows: usize) -> Self {
        assert!(row0 + rows <= self.rows, "rows out of the view");
        Self {
            first: self.first + row0 * self.stride,
            rows,
            ..self
        }
    }

    #[inline(always)]
    fn width(self) -> usize {
        self.width
    }

    /// Only rows that are not one contiguous run (a KV head's part of the rows of a
    /// region holding several heads) are asked for: contiguous rows (a decoded tile, a
    /// region of one KV head) stream as the hardware prefetchers expect, or are in cache.
    #[inline(always)]
    fn prefetch(self, row: usize, col: usize, n: usize) {
        if self.stride > self.width {
            let at = |c: usize| self.ptr.wrapping_add(self.first + row * self.stride + c);
            prefetch_span(at(col).cast(), at(col + n).cast());
        }
    }

    #[inline(always)]
    unsafe fn load8(self, row: usize, col: usize) -> __m256 {
        // SAFETY: as the trait says.
        unsafe { _mm256_loadu_ps(self.ptr.add(self.first + row * self.stride + col)) }
    }

    #[inline(always)]
    unsafe fn load16(self, row: usize, col: usize) -> __m512 {
        // SAFETY: as the trait says.
        unsafe { _mm512_loadu_ps(self.ptr.add(self.first + row * self.stride + col)) }
    }
}

/// F16 rows of a packed region: row `i` starts at half `first + i * stride`.
#[derive(Clone, Copy)]
pub(crate) struct F16Rows {
    ptr: *const u16,
    stride: usize,
    first: usize,
    rows: usize,
    width: usize,
}

impl F16Rows {
    /// Rows `first + i * stride` (`i < rows`, counted in halves) of `region`'s bytes,
    /// `width` halves each; `None` where one lies outside it or the bytes are not
    /// aligned to halves.
    pub fn new(
        region: &[u8],
        stride: usize,
        first: usize,
        rows: usize,
        width: usize,
    ) -> Option<F16Rows> {
        let halves: &[u16] = bytemuck::try_cast_slice(region).ok()?;
        inside(halves.len(), stride, first, rows, width).then_some(F16Rows {
            ptr: halves.as_ptr(),
            stride,
            first,
            rows,
            width,
        })
    }
}

// SAFETY: loads at half `first + row * stride + col`, inside the rows the caller names.
unsafe impl Rows for F16Rows {
    #[inline(always)]
    fn rows(self) -> usize {
        self.rows
    }

    #[inline(always)]
    fn sub(self, row0: usize, rows: usize) -> Self {
        assert!(row0 + rows <= self.rows, "rows out of the view");
        Self {
            first: self.first + row0 * self.stride,
            rows,
            ..self
        }
    }

    #[inline(always)]
    fn width(self) -> usize {
        self.width
    }

    #[inline(always)]
    fn prefetch(self, row: usize, col: usize, n: usize) {
        let at = |c: usize| self.ptr.wrapping_add(self.first + row * self.stride + c);
        prefetch_span(at(col).cast(), at(col + n).cast());
    }

    #[inline(always)]
    unsafe fn load8(self, row: usize, col: usize) -> __m256 {
        let p = self.ptr.wrapping_add(self.first + row * self.stride + col);
        // SAFETY: eight halves at `p` (trait).
        unsafe { _mm256_cvtph_ps(_mm_loadu_si128(p.cast())) }
    }

    #[inline(always)]
    unsafe fn load16(self, row: usize, col: usize) -> __m512 {
        let p = self.ptr.wrapping_add(self.first + row * self.stride + col);
        // SAFETY: sixteen halves at `p` (trait).
        unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(p.cast())) }
    }

    #[inline(always)]
    unsafe fn load8_both(self, row: usize, col: usize) -> __m512 {
        let p = self.ptr.wrapping_add(self.first + row * self.stride + col);
        // SAFETY: eight halves at `p` (trait), widened once in each half.
        unsafe { _mm512_cvtph_ps(_mm256_broadcastsi128_si256(_mm_loadu_si128(p.cast()))) }
    }
}

/// Q8_0 rows of a packed region: row `i`'s head starts at byte `first + i * row_bytes`,
/// a run of blocks (an f16 scale, then 32 signed quants).
#[derive(Clone, Copy)]
pub(crate) struct Q8Rows {
    ptr: *const u8,
    row_bytes: usize,
    first: usize,
    rows: usize,
    width: usize,
}

impl Q8Rows {
    /// Rows at bytes `first + i * row_bytes` (`i < rows`) of `region`, `width` values
    /// (whole blocks) each; `None` where one lies outside it or `width` is not whole
    /// blocks.
    pub fn new(
        region: &[u8],
        row_bytes: usize,
        first: usize,
        rows: usize,
        width: usize,
    ) -> Option<Q8Rows> {
        let bytes = width / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
        (width.is_multiple_of(Q8_0_BLOCK) && inside(region.len(), row_bytes, first, rows, bytes))
            .then_some(Q8Rows {
                ptr: region.as_ptr(),
                row_bytes,
                first,
                rows,
                width,
            })
    }

    /// The block holding column `col` of row `row`, and the column's place in it.
    #[inline(always)]
    fn block(self, row: usize, col: usize) -> (*const u8, usize) {
        let at = self.first + row * self.row_bytes + col / Q8_0_BLOCK * Q8_0_BLOCK_BYTES;
        (self.ptr.wrapping_add(at), col % Q8_0_BLOCK)
    }
}

/// The f16 scale at the start of the Q8_0 block at `b`, widened (exact).
///
/// # Safety
/// Two bytes readable at `b`; F16C enabled.
#[inline(always)]
unsafe fn scale(b: *const u8) -> f32 {
    // SAFETY: two bytes at `b` (caller).
    unsafe {
        let h = b.cast::<u16>().read_unaligned();
        _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(h))))
    }
}

// SAFETY: loads the scale and quants of the block holding the columns, inside the rows
// the caller names (8 or 16 columns never cross a 32-column block).
unsafe impl Rows for Q8Rows {
    const BLOCK_LOADS: bool = true;

    #[inline(always)]
    fn prefetch(self, row: usize, col: usize, n: usize) {
        let at = |c: usize| {
            let (b, j) = self.block(row, c);
            b.wrapping_add(j)
        };
        prefetch_span(at(col), at(col + n));
    }

    #[inline(always)]
    fn rows(self) -> usize {
        self.rows
    }

    #[inline(always)]
    fn sub(self, row0: usize, rows: usize) -> Self {
        assert!(row0 + rows <= self.rows, "rows out of the view");
        Self {
            first: self.first + row0 * self.row_bytes,
            rows,
            ..self
        }
    }

    #[inline(always)]
    fn width(self) -> usize {
        self.width
    }

    #[inline(always)]
    unsafe fn load8(self, row: usize, col: usize) -> __m256 {
        let (b, j) = self.block(row, col);
        // SAFETY: the block's two scale bytes and quants j..j + 8 (trait).
        unsafe {
            let d = _mm256_set1_ps(scale(b));
            let q = _mm_loadl_epi64(b.add(2 + j).cast());
            _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d)
        }
    }

    #[inline(always)]
    unsafe fn load16(self, row: usize, col: usize) -> __m512 {
        let (b, j) = self.block(row, col);
        // SAFETY: the block's two scale bytes and quants j..j + 16 (trait).
        unsafe { widen16(b, j, _mm512_set1_ps(scale(b))) }
    }

    // The wider loads read each block's scale once: the same values, fewer
    // instructions per loaded value (decode attention is bound by them on Q8_0).

    #[inline(always)]
    unsafe fn load32(self, row: usize, col: usize) -> [__m256; 4] {
        let (b, _) = self.block(row, col);
        // SAFETY: the block's two scale bytes and its 32 quants (trait: `col` starts it).
        unsafe {
            let d = _mm256_set1_ps(scale(b));
            std::array::from_fn(|j| {
                let q = _mm_loadl_epi64(b.add(2 + 8 * j).cast());
                _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)), d)
            })
        }
    }

    #[inline(always)]
    unsafe fn load64(self, row: usize, col: usize) -> [__m512; 4] {
        let (b0, _) = self.block(row, col);
        let (b1, _) = self.block(row, col + Q8_0_BLOCK);
        // SAFETY: two whole blocks (trait: `col` starts the first).
        unsafe {
            let (d0, d1) = (_mm512_set1_ps(scale(b0)), _mm512_set1_ps(scale(b1)));
            [
                widen16(b0, 0, d0),
                widen16(b0, 16, d0),
                widen16(b1, 0, d1),
                widen16(b1, 16, d1),
            ]
        }
    }

    #[inline(always)]
    unsafe fn load32_both(self, row: usize, col: usize) -> [__m512; 4] {
        let (b, _) = self.block(row, col);
        // SAFETY: the block's two scale bytes and its 32 quants (trait: `col` starts it).
        unsafe {
            let d = _mm512_set1_ps(scale(b));
            let (lo, hi) = (widen16(b, 0, d), widen16(b, 16, d));
            // Each 128-bit pair of a half into both halves: [l0 l1 l0 l1], [l2 l3 l2 l3].
            [
                _mm512_shuffle_f32x4::<0b01_00_01_00>(lo, lo),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(lo, lo),
                _mm512_shuffle_f32x4::<0b01_00_01_00>(hi, hi),
                _mm512_shuffle_f32x4::<0b11_10_11_10>(hi, hi),
            ]
        }
    }
}

/// Quants `j..j + 16` of the Q8_0 block at `b`, each times `d` (the decoded values).
///
/// # Safety
/// Bytes `2 + j .. 2 + j + 16` readable at `b`; AVX-512 F enabled.
#[inline(always)]
unsafe fn widen16(b: *const u8, j: usize, d: __m512) -> __m512 {
    // SAFETY: sixteen quants at `b + 2 + j` (caller).
    unsafe {
        let q = _mm_loadu_si128(b.add(2 + j).cast());
        _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(q)), d)
    }
}
