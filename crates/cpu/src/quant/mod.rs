//! Activation quantizers and quantized dot products, each with a portable scalar reference
//! beside an AVX2/FMA/F16C kernel.
//!
//! Pairing follows ggml: the 32-element types (legacy, IQ4_NL, MXFP4) dot against Q8_0
//! activations, the k-quants, the 256-element i-quants and TQ1_0/TQ2_0 against Q8_K
//! (`table32` and `grouped` hold the kernels of the newer types, the latter's AVX2 ones
//! for the lattice and ternary types sitting in `lattice` and `ternary`). Q4_1 and Q5_1
//! also take Q8_0 (ggml uses Q8_1, whose extra per-block sum
//! `d * Σq` is stored as f16); the kernels here recompute `Σq` exactly from the levels, so
//! their results can differ from ggml's by that f16 rounding.
//!
//! Reduction order is part of each kernel's contract, so results never depend on the ISA:
//! - k-quants: each super-block's integer dot is exact, then
//!   `sum += (dy * dx) * sumi - (dy * dmin) * summ` in block order (bitwise equal across ISAs);
//! - 256-element i-quants and ternary types: likewise, `sum += (f * dy) * sumi` (see
//!   `grouped`);
//! - 32-element types: eight lane accumulators (lane `l` takes elements `4l..4l+4` of each
//!   block, `acc[l] += d * s_l`) reduced as `((a0+a4)+(a2+a6)) + ((a1+a5)+(a3+a7))`, which the
//!   scalar code replays (bitwise equal across ISAs);
//! - float rows: the AVX2 kernel uses FMA and 32 accumulators, so it differs from the scalar
//!   loop by float rounding only (see the bound in `float`'s tests).
//!
//! `repack`, `repack_k` and `repack_k6` hold the row-interleaved Q5_0/Q8_0, Q4_K and Q6_K
//! tiles behind
//! [`crate::matmul::RepackedMatrix`], whose kernels keep eight output rows in the lanes of
//! one accumulator (their own reduction order is documented there). Each file also holds
//! the AVX-512 VNNI versions of its kernels (`vnni` has the steps they share), chosen at
//! run time where the CPU has them and bitwise equal to the AVX2 and scalar ones.
//!
//! Activation levels must lie in `-127..=127`, as both quantizers produce: the AVX2 kernels
//! use the sign trick (`|w| * sign(y, w)`), which is exact only in that range.

mod act;
mod float;
mod grouped;
#[cfg(target_arch = "x86_64")]
mod ktile;
#[cfg(target_arch = "x86_64")]
mod lattice;
mod legacy;
mod q2_k;
mod q3_k;
mod q4_0;
mod q4_1;
mod q4_k;
mod q5_0;
mod q5_1;
mod q5_k;
mod q6_k;
mod q8_0;
pub(crate) mod repack;
pub(crate) mod repack_k;
pub(crate) mod repack_k6;
pub(crate) mod repack_nl;
pub(crate) mod repack_xs;
#[cfg(target_arch = "x86_64")]
mod simd;
mod table32;
#[cfg(target_arch = "x86_64")]
mod ternary;
#[cfg(test)]
pub(crate) mod testutil;
#[cfg(target_arch = "x86_64")]
mod vnni;
#[cfg(target_arch = "x86_64")]
pub(crate) mod wide;

pub(crate) use act::{q8_0_into, q8_k_into};
pub use act::{
    quantize_row_q8_0, quantize_row_q8_0_with, quantize_row_q8_k, quantize_row_q8_k_with,
    QuantizeError,
};
pub use float::{dot_bf16, dot_f16, dot_f32};
pub(crate) use float::{dot_float, FloatWeight};

use minfer_gguf::quant::Block;

/// The instruction set a kernel runs with; an `Avx2` value exists only after detection
/// confirmed AVX2, FMA and F16C, and a `Vnni` value only after detection confirmed those
/// plus AVX-512 F/BW/VL/VNNI, which is what makes the dispatch sound.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Isa(IsaKind);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IsaKind {
    Scalar,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX2 plus the 256-bit forms of AVX-512 VNNI (`vpdpbusd` on ymm registers). Only the
    /// repacked tile kernels have VNNI versions; every other kernel runs its AVX2 code.
    #[cfg(target_arch = "x86_64")]
    Vnni,
}

/// The one instruction-set choice of the process: a process-wide value rather than a
/// backend option, because every kernel entry point (matmul, activation quantisation, the
/// vector primitives) asks for it without a backend at hand.
static CHOSEN: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();

/// The most a [`Isa::set_cap`] lets the kernels use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IsaCap {
    /// The AVX2 kernels without VNNI (or scalar on a CPU without AVX2).
    Avx2,
    /// The portable scalar kernels.
    Scalar,
}

impl Isa {
    /// The portable scalar kernels (always available).
    pub const SCALAR: Isa = Isa(IsaKind::Scalar);

    /// The instruction set the kernels run with: the best this CPU supports, under the
    /// cap [`Isa::set_cap`] put in force, chosen on first use and fixed for the process.
    pub fn detect() -> Isa {
        *CHOSEN.get_or_init(|| Isa::best_under(None))
    }

    /// Caps the kernels at `cap` for the rest of the process (to compare kernels on one
    /// machine; the results are the same). The choice is made once, so the caller sets it
    /// before the first kernel runs (the command line does at start-up): `Err` carries the
    /// instruction set already chosen when it differs from what `cap` allows.
    pub fn set_cap(cap: IsaCap) -> Result<(), Isa> {
        let want = Isa::best_under(Some(cap));
        match *CHOSEN.get_or_init(|| want) {
            got if got == want => Ok(()),
            got => Err(got),
        }
    }

    /// The best instruction set this CPU supports, no better than `cap`.
    fn best_under(cap: Option<IsaCap>) -> Isa {
        match cap {
            None => Isa::vnni().or_else(Isa::avx2).unwrap_or(Isa::SCALAR),
            Some(IsaCap::Avx2) => Isa::avx2().unwrap_or(Isa::SCALAR),
            Some(IsaCap::Scalar) => Isa::SCALAR,
        }
    }

    /// The AVX2 kernels with VNNI tile kernels, or `None` when this CPU lacks AVX2, FMA,
    /// F16C or any of AVX-512 F/BW/VL/VNNI.
    pub fn vnni() -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            if Isa::avx2().is_some()
                && is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vnni")
            {
                return Some(Isa(IsaKind::Vnni));
            }
        }
        None
    }

    /// The AVX2/FMA/F16C kernels, or `None` when this CPU lacks any of them.
    pub fn avx2() -> Option<Isa> {
        #[cfg(target_arch = "x86_64")]
        {
            if is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
            {
                return Some(Isa(IsaKind::Avx2));
            }
        }
        None
    }

    /// Whether the AVX2 kernels run (true for [`Isa::vnni`] too, a superset).
    pub fn is_avx2(self) -> bool {
        self != Isa::SCALAR
    }

    /// A short name for logs and benchmarks.
    pub fn name(self) -> &'static str {
        match self.0 {
            IsaKind::Scalar => "scalar",
            #[cfg(target_arch = "x86_64")]
            IsaKind::Avx2 => "avx2",
            #[cfg(target_arch = "x86_64")]
            IsaKind::Vnni => "avx2+vnni",
        }
    }
}

/// A weight block type with a dot product against its activation block type.
///
/// Both kernels compute, for each of `NT` activation rows, the dot product of the weight
/// row `w` with that activation row; slices have equal block counts (checked by [`dot`]).
/// Processing several activation rows per call decodes each weight block once for all of
/// them; every row's result is independent of `NT`.
pub trait QuantDot: Block {
    /// The activation block type: [`minfer_gguf::quant::BlockQ8_0`] or
    /// [`minfer_gguf::quant::BlockQ8K`].
    type Act: Block;

    /// The scalar reference kernel.
    fn dot_scalar<const NT: usize>(w: &[Self], x: [&[Self::Act]; NT]) -> [f32; NT];

    /// The AVX2 kernel (the scalar one for types without a dedicated kernel).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[cfg(target_arch = "x86_64")]
    unsafe fn dot_avx2<const NT: usize>(w: &[Self], x: [&[Self::Act]; NT]) -> [f32; NT] {
        Self::dot_scalar(w, x)
    }

    /// Whether [`Self::rows8_avx2`] has a kernel of its own for prefill (else it runs
    /// [`Self::dot_avx2`] row by row).
    const ROWS8: bool = false;

    /// The eight weight rows `w` (equal lengths) against the `nt` activation rows of `x`
    /// (one after another, each as long as a weight row), each result handed to
    /// `emit(token, row, value)` with the bits of [`Self::dot_avx2`].
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C, and AVX-512 F/BW/VL/VNNI when `vnni`;
    /// `x` holds `nt` rows of `w[0].len()` blocks.
    #[cfg(target_arch = "x86_64")]
    unsafe fn rows8_avx2(
        vnni: bool,
        w: [&[Self]; 8],
        x: &[Self::Act],
        nt: usize,
        emit: &mut dyn FnMut(usize, usize, f32),
    ) {
        let _ = vnni;
        let bpr = w[0].len();
        for t in 0..nt {
            for (r, row) in w.iter().enumerate() {
                emit(t, r, Self::dot_avx2(row, [&x[t * bpr..(t + 1) * bpr]])[0]);
            }
        }
    }
}

/// The [`QuantDot::ROWS8`] items of an impl whose 8-row prefill tiles are
/// `$rows8(vnni, w, x, nt, emit)` (Q8_K activations).
macro_rules! rows8_items {
    ($rows8:path) => {
        #[cfg(target_arch = "x86_64")]
        const ROWS8: bool = true;

        #[cfg(target_arch = "x86_64")]
        unsafe fn rows8_avx2(
            vnni: bool,
            w: [&[Self]; 8],
            x: &[minfer_gguf::quant::BlockQ8K],
            nt: usize,
            emit: &mut dyn FnMut(usize, usize, f32),
        ) {
            $rows8(vnni, w, x, nt, emit)
        }
    };
}
use rows8_items;

/// Whether `B` has 8-row prefill tiles ([`QuantDot::rows8_avx2`]) that run on `isa`:
/// `Some(vnni)`, the flag that kernel takes.
pub(crate) fn rows8_kernel<B: QuantDot>(isa: Isa) -> Option<bool> {
    if !B::ROWS8 {
        return None;
    }
    match isa.0 {
        #[cfg(target_arch = "x86_64")]
        IsaKind::Avx2 => Some(false),
        #[cfg(target_arch = "x86_64")]
        IsaKind::Vnni => Some(true),
        _ => None,
    }
}

/// Errors of the checked dot-product entry points.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DotError {
    /// Weight and activation rows have different lengths.
    #[error("dot product of rows with {weights} and {activations} blocks/elements")]
    Length {
        /// Weight blocks (or elements for float rows).
        weights: usize,
        /// Activation blocks (or elements).
        activations: usize,
    },
}

/// Dot products of one weight row with `NT` activation rows using `isa`.
pub fn dot<B: QuantDot, const NT: usize>(
    isa: Isa,
    w: &[B],
    x: [&[B::Act]; NT],
) -> Result<[f32; NT], DotError> {
    if let Some(bad) = x.iter().find(|a| a.len() != w.len()) {
        return Err(DotError::Length {
            weights: w.len(),
            activations: bad.len(),
        });
    }
    Ok(dot_unchecked(isa, w, x))
}

/// [`dot`] without the length check; callers guarantee equal block counts (a mismatch
/// panics on a slice bound, it cannot read out of bounds).
#[inline]
pub(crate) fn dot_unchecked<B: QuantDot, const NT: usize>(
    isa: Isa,
    w: &[B],
    x: [&[B::Act]; NT],
) -> [f32; NT] {
    match isa.0 {
        IsaKind::Scalar => B::dot_scalar(w, x),
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `Avx2` and `Vnni` values are only constructed after runtime detection
        // of (at least) AVX2, FMA and F16C (see `Isa::avx2`, `Isa::vnni`).
        IsaKind::Avx2 | IsaKind::Vnni => unsafe { B::dot_avx2(w, x) },
    }
}

/// Sums eight lane accumulators in the fixed order the AVX2 horizontal sum uses.
#[inline]
pub(crate) fn hsum8_fixed(a: [f32; 8]) -> f32 {
    let b = [a[0] + a[4], a[1] + a[5], a[2] + a[6], a[3] + a[7]];
    (b[0] + b[2]) + (b[1] + b[3])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cap_limits_the_choice_and_comes_too_late_once_made() {
        assert_eq!(Isa::best_under(Some(IsaCap::Scalar)), Isa::SCALAR);
        assert_eq!(
            Isa::best_under(Some(IsaCap::Avx2)),
            Isa::avx2().unwrap_or(Isa::SCALAR)
        );
        let chosen = Isa::detect();
        // The choice is made: a cap that agrees with it is accepted, one that does not is
        // refused with what the kernels run.
        let scalar = Isa::set_cap(IsaCap::Scalar);
        if chosen == Isa::SCALAR {
            assert_eq!(scalar, Ok(()));
        } else {
            assert_eq!(scalar, Err(chosen));
        }
        assert_eq!(Isa::detect(), chosen);
    }
}
