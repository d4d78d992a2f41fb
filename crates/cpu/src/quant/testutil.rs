//! Test helpers: deterministic inputs and the generic kernel checks every type runs.

use super::{dot, Isa, QuantDot};
use half::f16;
use minfer_gguf::quant::{Block, BlockIq1M, Quantize};

/// Deterministic pseudo-random values in `-scale..scale`.
pub(crate) fn rand_f32(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    minfer_testkit::Rng::new(seed).vec(n, scale)
}

/// Quantizes `x` block by block with the reference quantizer of `B`.
pub(crate) fn quantize_blocks<B: Quantize>(x: &[f32]) -> Vec<B> {
    x.chunks_exact(B::ELEMS).map(B::quantize).collect()
}

/// Dequantizes blocks with the reference dequantizer.
pub(crate) fn dequantize_blocks<B: Block>(b: &[B]) -> Vec<f32> {
    let mut out = vec![0.0; b.len() * B::ELEMS];
    for (blk, o) in b.iter().zip(out.chunks_exact_mut(B::ELEMS)) {
        blk.dequantize(o);
    }
    out
}

/// The ISAs this machine can run, scalar first.
pub(crate) fn isas() -> Vec<Isa> {
    std::iter::once(Isa::SCALAR)
        .chain(Isa::avx2())
        .chain(Isa::vnni())
        .collect()
}

/// Checks `B`'s kernels on `n_blocks` random blocks against four activation rows:
/// - scalar and AVX2 agree bitwise (the reduction order is fixed, see the module docs);
/// - a batch of four rows gives the same bits as four single-row calls;
/// - each result is within `1e-5 * Σ|w_i y_i|` of the f64 dot of the dequantized weights
///   and dequantized activations (only f32 accumulation rounding separates them);
/// - each result is within the activation quantization error of the dot with the original
///   f32 activations: `Σ |w_i| * |y_i - ŷ_i|` plus the same rounding slack.
pub(crate) fn check_kernel<B: QuantDot + Quantize>(n_blocks: usize, seed: u64)
where
    B::Act: Quantize,
{
    let wf = rand_f32(n_blocks * B::ELEMS, seed, 1.5);
    check_kernel_on::<B>(quantize_blocks(&wf), seed);
}

/// `n` blocks of random bytes, each passed with a random word to `fix` (which makes the
/// scale fields finite), for types without an encoder.
pub(crate) fn random_blocks<B: Block>(n: usize, seed: u64, fix: impl Fn(&mut B, u32)) -> Vec<B> {
    let size = std::mem::size_of::<B>();
    let mut s = seed.wrapping_mul(0x2545_f491_4f6c_dd1d) | 1;
    let mut next = move || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        (s >> 32) as u32
    };
    (0..n)
        .map(|_| {
            let bytes: Vec<u8> = (0..size).map(|_| next() as u8).collect();
            let mut b: B = bytemuck::pod_read_unaligned(&bytes);
            fix(&mut b, next());
            b
        })
        .collect()
}

/// A finite f16 scale of moderate size from a random word.
pub(crate) fn small_f16(r: u32) -> f16 {
    f16::from_f32(((r % 2001) as f32 - 1000.0) * 1e-5)
}

/// A [`random_blocks`] fix for IQ1_M, whose f16 scale is spread over four nibbles.
pub(crate) fn iq1m_valid_scale(b: &mut BlockIq1M, r: u32) {
    let bits = small_f16(r).to_bits();
    for i in 0..4 {
        let nib = ((bits >> (4 * i)) & 0xf) as u8;
        b.scales[2 * i + 1] = (b.scales[2 * i + 1] & 0x0f) | (nib << 4);
    }
}

/// Checks that every ISA gives the scalar kernel's bits for a batch of `NT` activation
/// rows and for each row alone: row 0 holds only the extreme levels ±127 (the largest
/// products the kernels' integer lanes meet), the others random levels.
pub(crate) fn check_rows<B: QuantDot, const NT: usize>(w: &[B], seed: u64)
where
    B::Act: Quantize,
{
    let n = w.len() * B::ELEMS;
    let xq: Vec<Vec<B::Act>> = (0..NT)
        .map(|t| {
            let x = if t == 0 {
                let signs = rand_f32(n, seed, 1.0);
                signs
                    .iter()
                    .map(|s| if *s < 0.0 { -2.0 } else { 2.0 })
                    .collect()
            } else {
                rand_f32(n, seed + t as u64, 3.0)
            };
            quantize_blocks(&x)
        })
        .collect();
    let rows: [&[B::Act]; NT] = std::array::from_fn(|t| &xq[t][..]);
    let scalar = dot(Isa::SCALAR, w, rows).unwrap();
    for isa in isas() {
        let batch = dot(isa, w, rows).unwrap();
        for t in 0..NT {
            let single = dot(isa, w, [rows[t]]).unwrap()[0];
            assert_eq!(batch[t].to_bits(), single.to_bits(), "{isa:?} row {t}");
            assert_eq!(
                batch[t].to_bits(),
                scalar[t].to_bits(),
                "{isa:?} vs scalar, row {t} of {NT}: {} vs {}",
                batch[t],
                scalar[t]
            );
        }
    }
}

/// [`check_kernel`] on given weight blocks.
pub(crate) fn check_kernel_on<B: QuantDot>(w: Vec<B>, seed: u64)
where
    B::Act: Quantize,
{
    let n = w.len() * B::ELEMS;
    let wd = dequantize_blocks(&w);
    let xs: Vec<Vec<f32>> = (0..4).map(|t| rand_f32(n, seed + 100 + t, 3.0)).collect();
    let xq: Vec<Vec<B::Act>> = xs.iter().map(|x| quantize_blocks(x)).collect();
    let rows: [&[B::Act]; 4] = [&xq[0], &xq[1], &xq[2], &xq[3]];

    let scalar4 = dot(Isa::SCALAR, &w, rows).unwrap();
    for isa in isas() {
        let batch = dot(isa, &w, rows).unwrap();
        for t in 0..4 {
            let single = dot(isa, &w, [rows[t]]).unwrap()[0];
            assert_eq!(batch[t].to_bits(), single.to_bits(), "{isa:?} row {t}");
            assert_eq!(
                batch[t].to_bits(),
                scalar4[t].to_bits(),
                "{isa:?} vs scalar, row {t}: {} vs {}",
                batch[t],
                scalar4[t]
            );
        }
        let pair = dot(isa, &w, [rows[2], rows[3]]).unwrap();
        assert_eq!(
            pair.map(f32::to_bits),
            [batch[2], batch[3]].map(f32::to_bits)
        );
    }

    for t in 0..4 {
        let xd = dequantize_blocks(&xq[t]);
        let exact: f64 = wd.iter().zip(&xd).map(|(a, b)| *a as f64 * *b as f64).sum();
        let mag: f64 = wd
            .iter()
            .zip(&xd)
            .map(|(a, b)| (*a as f64 * *b as f64).abs())
            .sum();
        let got = scalar4[t] as f64;
        assert!(
            (got - exact).abs() <= 1e-5 * mag,
            "row {t}: {got} vs {exact} (magnitude {mag})"
        );
        let vs_f32: f64 = wd
            .iter()
            .zip(&xs[t])
            .map(|(a, b)| *a as f64 * *b as f64)
            .sum();
        let qerr: f64 = wd
            .iter()
            .zip(xs[t].iter().zip(&xd))
            .map(|(a, (x, y))| (*a as f64).abs() * (*x as f64 - *y as f64).abs())
            .sum();
        assert!(
            (got - vs_f32).abs() <= qerr + 1e-5 * mag,
            "row {t}: {got} vs f32 {vs_f32} (activation error bound {qerr})"
        );
        assert!(
            qerr < 0.02 * mag,
            "activation quantization too coarse: {qerr} of {mag}"
        );
    }
}

/// Checks that mismatched row lengths are a typed error.
pub(crate) fn check_length_error<B: QuantDot + Quantize>()
where
    B::Act: Quantize,
{
    let w: Vec<B> = quantize_blocks(&rand_f32(2 * B::ELEMS, 1, 1.0));
    let x: Vec<B::Act> = quantize_blocks(&rand_f32(B::ELEMS, 2, 1.0));
    assert_eq!(
        dot(Isa::detect(), &w, [&x[..]]),
        Err(super::DotError::Length {
            weights: 2,
            activations: 1
        })
    );
}

/// Runs `B`'s 8-row prefill tiles ([`QuantDot::rows8_avx2`]) on `rows` against the `nt`
/// activation rows of `x` and checks each result against the row kernel bit for bit, on
/// AVX2 and, where the CPU has it, VNNI.
#[cfg(target_arch = "x86_64")]
pub(crate) fn check_rows8<B: QuantDot<Act = minfer_gguf::quant::BlockQ8K>>(
    rows: [&[B]; 8],
    x: &[minfer_gguf::quant::BlockQ8K],
    nt: usize,
) {
    // Without tiles of its own the type runs the row kernel, which this check could not
    // tell from a correct tile kernel.
    assert!(B::ROWS8, "the type has no tile kernel to check");
    let Some(avx2) = Isa::avx2() else { return };
    let bpr = rows[0].len();
    for vnni in [false, true] {
        if vnni && Isa::vnni().is_none() {
            continue;
        }
        let mut got = vec![f32::NAN; nt * 8];
        // SAFETY: the features were detected above; `x` holds `nt` rows of `bpr` blocks.
        unsafe { B::rows8_avx2(vnni, rows, x, nt, &mut |t, r, v| got[t * 8 + r] = v) };
        for t in 0..nt {
            for (r, row) in rows.iter().enumerate() {
                let want = dot(avx2, row, [&x[t * bpr..(t + 1) * bpr]]).unwrap()[0];
                let v = got[t * 8 + r];
                assert_eq!(
                    v.to_bits(),
                    want.to_bits(),
                    "bpr {bpr} nt {nt} vnni {vnni} token {t} row {r}: {v} vs {want}"
                );
            }
        }
    }
}
