//! Quantize→dequantize error bounds.
//!
//! The first test reproduces ggml's `test-quantize-fns` "absolute quantization error" check:
//! 4096 values `0.1 + 2*cos(i)`, error `sqrt(sum of squared differences) / n`, against
//! ggml's constants. (That metric is the RMS error divided by `sqrt(n)`, so ggml's bounds
//! are loose; the second test adds tighter per-type bounds on the relative RMS error.)

use minfer_gguf::quant::{dequantize_to_vec, has_quantizer, quantize_to_vec};
use minfer_gguf::{GgmlType, ALL_TYPES};
use minfer_testkit::Rng;

const MAX_QUANTIZATION_TOTAL_ERROR: f32 = 0.002;
const MAX_QUANTIZATION_TOTAL_ERROR_2BITS: f32 = 0.0075;
const MAX_QUANTIZATION_TOTAL_ERROR_3BITS: f32 = 0.0040;
const MAX_QUANTIZATION_TOTAL_ERROR_TERNARY: f32 = 0.01;
const MAX_QUANTIZATION_TOTAL_ERROR_3BITS_XXS: f32 = 0.0050;
// ggml has no bound for the types it cannot encode without an imatrix, nor for IQ1_M;
// these sit about 15% above what the encoders here measure (0.0078 / 0.0081, 0.0122 /
// 0.0127) with their `x²` weights.
const MAX_QUANTIZATION_TOTAL_ERROR_IQ2_XS: f32 = 0.0093;
const MAX_QUANTIZATION_TOTAL_ERROR_IQ1: f32 = 0.0147;

/// ggml's synthetic data: `0.1 + 2*cosf(i + offset)`, summed in double as its C does.
fn generate_data(offset: f32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| (0.1f64 + 2.0 * ((i as f32 + offset).cos() as f64)) as f32)
        .collect()
}

/// ggml's `array_rmse`: `sqrtf(sum of squared differences) / n`.
fn ggml_array_rmse(a: &[f32], b: &[f32]) -> f32 {
    let sum: f64 = a
        .iter()
        .zip(b)
        .map(|(x, y)| {
            let d = (x - y) as f64;
            d * d
        })
        .sum();
    (sum as f32).sqrt() / a.len() as f32
}

fn round_trip(ty: GgmlType, x: &[f32]) -> Vec<f32> {
    let q = quantize_to_vec(ty, x).expect("whole blocks");
    assert_eq!(q.len(), x.len() / ty.block_size() * ty.type_size());
    dequantize_to_vec(ty, &q, x.len()).expect("consistent lengths")
}

#[test]
fn total_quantization_error_within_ggml_bounds() {
    let test_size = 32 * 128;
    let data = generate_data(0.0, test_size);
    let mut failures = Vec::new();
    for ty in ALL_TYPES.into_iter().filter(|&t| has_quantizer(t)) {
        let out = round_trip(ty, &data);
        let err = ggml_array_rmse(&data, &out);
        let bound = match ty {
            GgmlType::Q2K | GgmlType::Iq2S => MAX_QUANTIZATION_TOTAL_ERROR_2BITS,
            GgmlType::Q3K | GgmlType::Iq3S => MAX_QUANTIZATION_TOTAL_ERROR_3BITS,
            GgmlType::Iq3Xxs => MAX_QUANTIZATION_TOTAL_ERROR_3BITS_XXS,
            GgmlType::Iq2Xs | GgmlType::Iq2Xxs => MAX_QUANTIZATION_TOTAL_ERROR_IQ2_XS,
            GgmlType::Iq1S | GgmlType::Iq1M => MAX_QUANTIZATION_TOTAL_ERROR_IQ1,
            GgmlType::Tq1_0 | GgmlType::Tq2_0 => MAX_QUANTIZATION_TOTAL_ERROR_TERNARY,
            _ => MAX_QUANTIZATION_TOTAL_ERROR,
        };
        // NaN fails too, as ggml's `!(error < max)` check does.
        if err.is_nan() || err >= bound {
            failures.push(format!("{ty}: {err} >= {bound}"));
        }
    }
    assert!(failures.is_empty(), "{failures:?}");
}

fn relative_rms_error(x: &[f32], y: &[f32]) -> f64 {
    let (mut err, mut pow) = (0.0f64, 0.0f64);
    for (a, b) in x.iter().zip(y) {
        err += ((a - b) as f64).powi(2);
        pow += (*a as f64).powi(2);
    }
    (err / pow).sqrt()
}

/// Upper bounds on the relative RMS error for roughly Gaussian data. They sit about 15%
/// above what the reference quantizers achieve, so a regression in a scale search or a
/// packing mistake trips them. `None` for a type without an encoder.
fn relative_bound(ty: GgmlType) -> Option<f64> {
    Some(match ty {
        GgmlType::F32 => 0.0,
        GgmlType::F16 => 2.5e-4,
        GgmlType::BF16 => 2.0e-3,
        GgmlType::Q8_0 => 0.0059,
        GgmlType::Q8K => 0.0072,
        GgmlType::Q6K => 0.0196,
        GgmlType::Q5_0 => 0.047,
        GgmlType::Q5_1 => 0.043,
        GgmlType::Q5K => 0.0405,
        GgmlType::Q4_0 => 0.094,
        GgmlType::Q4_1 => 0.088,
        GgmlType::Q4K => 0.080,
        GgmlType::Q3K => 0.168,
        GgmlType::Q2K => 0.33,
        // Measured 0.074 / 0.065 / 0.056 (IQ4_NL) on the three inputs; IQ4_XS within 1%.
        GgmlType::Iq4Nl => 0.086,
        GgmlType::Iq4Xs => 0.086,
        // Measured 0.115 / 0.106 / 0.085.
        GgmlType::Mxfp4 => 0.132,
        // Ternary types are for ternary-trained weights; on other data they are coarse
        // (measured 0.77 / 0.59 / 0.39).
        GgmlType::Tq1_0 | GgmlType::Tq2_0 => 0.885,
        // The lattice i-quants with `x²` weights (no importance matrix); measured on the
        // three inputs: 0.159 / 0.146 / 0.141 (IQ3_S), 0.209 / 0.197 / 0.195 (IQ3_XXS),
        // 0.260 / 0.242 / 0.240 (IQ2_S), 0.367 / 0.350 / 0.352 (IQ2_XS), 0.409 / 0.382 /
        // 0.362 (IQ2_XXS), 0.577 / 0.531 / 0.551 (IQ1_M), 0.621 / 0.549 / 0.574 (IQ1_S).
        GgmlType::Iq3S => 0.183,
        GgmlType::Iq3Xxs => 0.24,
        GgmlType::Iq2S => 0.30,
        GgmlType::Iq2Xs => 0.42,
        GgmlType::Iq2Xxs => 0.47,
        GgmlType::Iq1M => 0.66,
        GgmlType::Iq1S => 0.71,
    })
}

#[test]
fn relative_rms_error_within_per_type_bounds() {
    let n = 64 * 256;
    let mut rng = Rng::new(0x9e37_79b9);
    let gaussian: Vec<f32> = (0..n).map(|_| rng.normal()).collect();
    let uniform: Vec<f32> = (0..n).map(|_| rng.f32() * 3.0 + 0.5).collect();
    let smooth = generate_data(1.0, n);
    let mut failures = Vec::new();
    for ty in ALL_TYPES {
        let Some(bound) = relative_bound(ty) else {
            continue;
        };
        for (name, x) in [
            ("gaussian", &gaussian),
            ("uniform", &uniform),
            ("cosine", &smooth),
        ] {
            let err = relative_rms_error(x, &round_trip(ty, x));
            if err.is_nan() || err > bound {
                failures.push(format!("{ty} on {name}: relative rms {err:.6} > {bound}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn more_bits_means_less_error() {
    // A coarse sanity ordering on the same data: each family improves with bit depth.
    let mut rng = Rng::new(12345);
    let x: Vec<f32> = (0..16 * 256).map(|_| rng.normal()).collect();
    let e = |ty| relative_rms_error(&x, &round_trip(ty, &x));
    let ladder = [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q8K,
    ];
    for w in ladder.windows(2) {
        assert!(e(w[1]) < e(w[0]), "{} not better than {}", w[1], w[0]);
    }
    assert!(e(GgmlType::Q5_0) < e(GgmlType::Q4_0));
    assert!(e(GgmlType::Q5_1) < e(GgmlType::Q4_1));
    assert!(e(GgmlType::Q8_0) < e(GgmlType::Q5_0));
    // The non-linear table beats the uniform 4-bit grid at the same block size.
    assert!(e(GgmlType::Iq4Nl) < e(GgmlType::Q4_0));
    let lattice = [
        GgmlType::Iq1S,
        GgmlType::Iq1M,
        GgmlType::Iq2Xxs,
        GgmlType::Iq2Xs,
        GgmlType::Iq2S,
        GgmlType::Iq3Xxs,
        GgmlType::Iq3S,
    ];
    for w in lattice.windows(2) {
        assert!(e(w[1]) < e(w[0]), "{} not better than {}", w[1], w[0]);
    }
}

/// Rows of 256..4096 values, normal and heavy-tailed.
fn lattice_rows() -> Vec<(String, Vec<f32>)> {
    let mut rng = Rng::new(0x1a77_1ce5);
    let mut rows = Vec::new();
    for (i, len) in [256usize, 512, 1024, 4096].into_iter().enumerate() {
        let normal: Vec<f32> = (0..len).map(|_| rng.normal() * (0.01 + i as f32)).collect();
        // A normal over a uniform in [0.25, 1.25) (up to four times wider), and every 64th
        // value eight times larger: tails like a weight matrix's outliers.
        let heavy: Vec<f32> = (0..len)
            .map(|j| {
                let v = rng.normal() / (0.25 + rng.unit());
                if j % 64 == 17 {
                    8.0 * v
                } else {
                    v
                }
            })
            .collect();
        rows.push((format!("normal/{len}"), normal));
        rows.push((format!("heavy/{len}"), heavy));
    }
    rows
}

/// Upper bounds on the relative RMS error of the lattice i-quants on [`lattice_rows`]:
/// `(normal rows, heavy-tailed rows)`, about 15% above the measured worst row. The
/// encoders weigh by `x²` without importance weights (see the block types), so heavy
/// tails cost the 2-bit types much: the sub-block scale follows the outliers. A broken
/// encoder fails them: all-zero output scores 1.0.
fn lattice_bound(ty: GgmlType) -> (f64, f64) {
    match ty {
        // Measured worst rows: 0.168 / 0.284.
        GgmlType::Iq3S => (0.19, 0.33),
        // 0.213 / 0.378.
        GgmlType::Iq3Xxs => (0.245, 0.43),
        // 0.260 / 0.580.
        GgmlType::Iq2S => (0.30, 0.67),
        // 0.376 / 0.627.
        GgmlType::Iq2Xs => (0.43, 0.72),
        // 0.422 / 0.822.
        GgmlType::Iq2Xxs => (0.48, 0.93),
        // 0.602 / 0.604.
        GgmlType::Iq1M => (0.69, 0.69),
        // 0.659 / 0.803.
        GgmlType::Iq1S => (0.75, 0.92),
        _ => unreachable!("{ty} is not a lattice type"),
    }
}

#[test]
fn lattice_i_quants_on_normal_and_heavy_tailed_rows() {
    let rows = lattice_rows();
    let mut failures = Vec::new();
    for ty in [
        GgmlType::Iq3S,
        GgmlType::Iq3Xxs,
        GgmlType::Iq2S,
        GgmlType::Iq2Xs,
        GgmlType::Iq2Xxs,
        GgmlType::Iq1M,
        GgmlType::Iq1S,
    ] {
        let (normal, heavy) = lattice_bound(ty);
        assert!(
            normal < 1.0 && heavy < 1.0,
            "{ty}: a bound the zero output meets"
        );
        for (name, x) in &rows {
            let bound = if name.starts_with("heavy") {
                heavy
            } else {
                normal
            };
            let err = relative_rms_error(x, &round_trip(ty, x));
            if err.is_nan() || err > bound {
                failures.push(format!("{ty} on {name}: relative rms {err:.4} > {bound}"));
            }
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
