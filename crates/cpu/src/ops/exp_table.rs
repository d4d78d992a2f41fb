//! The constants of the exponential in [`super::exp`] (the C library's `expf` steps),
//! shared by its AVX2 and 512-bit kernels, and the fix-up of lanes that take the
//! library's special-case branch.

/// `asuint64(2^(i/32)) - (i << 47)`: adding `k << 47` to entry `k % 32` gives `2^(k/32)`.
pub(super) const TAB: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `32 / ln 2`.
pub(super) const INV_LN2_N: f64 = f64::from_bits(0x4047_1547_652b_82fe);
/// `1.5 · 2^52`: adding it rounds to an integer held in the low mantissa bits.
pub(super) const SHIFT: f64 = f64::from_bits(0x4338_0000_0000_0000);
/// Polynomial coefficients for `2^(r/32)`, highest degree first.
pub(super) const C0: f64 = f64::from_bits(0x3fac_6af8_4b91_2394) / 32768.0;
pub(super) const C1: f64 = f64::from_bits(0x3fce_bfce_50fa_c4f3) / 1024.0;
pub(super) const C2: f64 = f64::from_bits(0x3fe6_2e42_ff0c_52d6) / 32.0;

/// Whether `x` takes the library's special-case branch (`|x| >= 88`, infinities, NaN).
#[inline]
pub(super) fn special(x: f32) -> bool {
    (x.to_bits() >> 20) & 0x7ff >= 88f32.to_bits() >> 20
}

/// Replaces each value of `v` whose input in `xs` takes the special-case branch by
/// `f32::exp` of that input (the vector kernels' lanes are only right on the fast path).
#[inline]
pub(super) fn fix_special(v: &mut [f32], xs: &[f32]) {
    for (v, &x) in v.iter_mut().zip(xs) {
        if special(x) {
            *v = x.exp();
        }
    }
}
