//! Bit-exact checks of the reference (de)quantizers against golden vectors made by
//! `scripts/gen_quant_golden.py` from the Python `gguf` package (see that script for the
//! file format and for which references come from where).

use minfer_gguf::quant::{dequantize_to_vec, quantize_to_vec};
use minfer_gguf::{GgmlType, ALL_TYPES};
use std::path::PathBuf;

/// One parsed golden file.
struct Golden {
    ty: GgmlType,
    /// Raw blocks to dequantize.
    raw: Vec<u8>,
    /// Their expected dequantization.
    deq: Vec<f32>,
    /// Quantizer input (empty when the reference has no quantizer for the type).
    q_in: Vec<f32>,
    /// Expected quantizer output.
    q_out: Vec<u8>,
}

struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
    name: String,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> &'a [u8] {
        let end = self.pos + n;
        assert!(
            end <= self.bytes.len(),
            "{}: truncated at byte {}",
            self.name,
            self.pos
        );
        let s = &self.bytes[self.pos..end];
        self.pos = end;
        s
    }

    fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.take(4).try_into().unwrap())
    }

    fn f32s(&mut self, n: usize) -> Vec<f32> {
        self.take(4 * n)
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }
}

fn golden_path(ty: GgmlType) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{}.bin", ty.name().to_lowercase()))
}

fn load(ty: GgmlType) -> Golden {
    let path = golden_path(ty);
    let bytes = std::fs::read(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (regenerate with scripts/gen_quant_golden.py)",
            path.display()
        )
    });
    let mut r = Reader {
        bytes: &bytes,
        pos: 0,
        name: path.display().to_string(),
    };
    assert_eq!(r.take(4), b"MQGV", "{}: bad magic", r.name);
    assert_eq!(r.u32(), 1, "{}: version", r.name);
    assert_eq!(r.u32(), ty.id(), "{}: type id", r.name);
    let block = r.u32() as usize;
    let size = r.u32() as usize;
    assert_eq!(
        (block, size),
        (ty.block_size(), ty.type_size()),
        "{}",
        r.name
    );
    let n_deq = r.u32() as usize;
    let n_q = r.u32() as usize;
    let _flags = r.u32();
    let raw = r.take(n_deq * size).to_vec();
    let deq = r.f32s(n_deq * block);
    let q_in = r.f32s(n_q * block);
    let q_out = r.take(n_q * size).to_vec();
    assert_eq!(r.pos, bytes.len(), "{}: trailing bytes", r.name);
    Golden {
        ty,
        raw,
        deq,
        q_in,
        q_out,
    }
}

/// Returns a description of the first few mismatching elements, or `None` if all match.
fn compare_bits(expected: &[f32], got: &[f32], block: usize) -> Option<String> {
    let bad: Vec<usize> = (0..expected.len())
        .filter(|&i| expected[i].to_bits() != got[i].to_bits())
        .collect();
    if bad.is_empty() {
        return None;
    }
    let first: Vec<String> = bad
        .iter()
        .take(5)
        .map(|&i| {
            format!(
                "elem {i} (block {}): expected {:e} ({:#010x}) got {:e} ({:#010x})",
                i / block,
                expected[i],
                expected[i].to_bits(),
                got[i],
                got[i].to_bits()
            )
        })
        .collect();
    Some(format!("{} mismatches; {}", bad.len(), first.join("; ")))
}

#[test]
fn dequantize_matches_golden_bit_for_bit() {
    let mut failures = Vec::new();
    for ty in ALL_TYPES {
        let g = load(ty);
        assert!(
            !g.deq.is_empty(),
            "{ty}: golden file has no dequantize vectors"
        );
        let got = dequantize_to_vec(g.ty, &g.raw, g.deq.len()).expect("lengths are consistent");
        if let Some(msg) = compare_bits(&g.deq, &got, ty.block_size()) {
            failures.push(format!("{ty}: {msg}"));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn quantize_matches_golden_byte_for_byte() {
    // The reference implements quantizers for these; the k-quants and i-quants have none
    // to compare (IQ4_NL/IQ4_XS encoders are checked by error bounds in quant_error.rs).
    let expected_types = [
        GgmlType::F16,
        GgmlType::BF16,
        GgmlType::Q4_0,
        GgmlType::Q4_1,
        GgmlType::Q5_0,
        GgmlType::Q5_1,
        GgmlType::Q8_0,
        GgmlType::Tq1_0,
        GgmlType::Tq2_0,
        GgmlType::Mxfp4,
    ];
    let mut failures = Vec::new();
    for ty in ALL_TYPES {
        let g = load(ty);
        assert_eq!(
            !g.q_in.is_empty(),
            expected_types.contains(&ty),
            "{ty}: quantize section presence"
        );
        if g.q_in.is_empty() {
            continue;
        }
        let got = quantize_to_vec(ty, &g.q_in).expect("whole blocks");
        assert_eq!(got.len(), g.q_out.len(), "{ty}");
        let size = ty.type_size();
        let bad: Vec<usize> = got
            .chunks_exact(size)
            .zip(g.q_out.chunks_exact(size))
            .enumerate()
            .filter(|(_, (a, b))| a != b)
            .map(|(i, _)| i)
            .collect();
        if let Some(&i) = bad.first() {
            failures.push(format!(
                "{ty}: {} of {} blocks differ; first is block {i}: expected {:02x?} got {:02x?}",
                bad.len(),
                got.len() / size,
                &g.q_out[i * size..(i + 1) * size],
                &got[i * size..(i + 1) * size],
            ));
        }
    }
    assert!(failures.is_empty(), "\n{}", failures.join("\n"));
}

#[test]
fn golden_files_stay_small() {
    let total: u64 = ALL_TYPES
        .iter()
        .map(|&ty| {
            std::fs::metadata(golden_path(ty))
                .map(|m| m.len())
                .unwrap_or(0)
        })
        .sum();
    assert!(
        total > 0 && total < 3 * 1024 * 1024,
        "golden files total {total} bytes"
    );
}

/// The input `scripts/gen_iq_quant_golden.c` quantizes: two rows of 512 from a 32-bit LCG,
/// roughly normal with every sixteenth value six times larger, and importance weights
/// `0.5 + uniform`. The float steps are the C program's, so the values are identical.
fn iq_golden_input() -> (Vec<f32>, Vec<f32>) {
    let mut state = 12345u32;
    let mut uniform = || {
        state = state.wrapping_mul(1664525).wrapping_add(1013904223);
        (state >> 8) as f32 * (1.0 / 16777216.0)
    };
    let x = (0..2 * 512)
        .map(|i| {
            let (a, b, c, d) = (uniform(), uniform(), uniform(), uniform());
            let v = ((a + b) + (c + d)) - 2.0;
            if i % 16 == 5 {
                6.0 * v
            } else {
                v
            }
        })
        .collect();
    let qw = (0..512).map(|_| 0.5 + uniform()).collect();
    (x, qw)
}

/// Encodes `x` (rows of 512) block by block with `f`, the importance weights repeating
/// per row.
fn encode_rows<B: bytemuck::Pod>(
    x: &[f32],
    qw: Option<&[f32]>,
    f: fn(&[f32], Option<&[f32]>) -> B,
) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, xb) in x.chunks_exact(256).enumerate() {
        let w = qw.map(|q| &q[256 * (i % 2)..256 * (i % 2) + 256]);
        out.extend_from_slice(bytemuck::bytes_of(&f(xb, w)));
    }
    out
}

#[test]
fn lattice_i_quant_encoders_match_ggml_byte_for_byte() {
    use minfer_gguf::quant::{
        BlockIq1M, BlockIq1S, BlockIq2S, BlockIq2Xs, BlockIq2Xxs, BlockIq3S, BlockIq3Xxs,
    };
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/golden/iq_lattice.txt");
    let text = std::fs::read_to_string(&path).expect("golden file");
    let (x, qw) = iq_golden_input();
    let mut checked = 0;
    for line in text.lines() {
        let mut parts = line.split(' ');
        let (Some(ty), Some(weights), Some(hex)) = (parts.next(), parts.next(), parts.next())
        else {
            panic!("malformed line {line:?}");
        };
        let expected: Vec<u8> = (0..hex.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
            .collect();
        let w = (weights == "imatrix").then_some(&qw[..]);
        let got = match ty {
            "IQ3_XXS" => encode_rows(&x, w, BlockIq3Xxs::quantize_weighted),
            "IQ3_S" => encode_rows(&x, w, BlockIq3S::quantize_weighted),
            "IQ2_XXS" => encode_rows(&x, w, BlockIq2Xxs::quantize_weighted),
            "IQ2_XS" => encode_rows(&x, w, BlockIq2Xs::quantize_weighted),
            "IQ2_S" => encode_rows(&x, w, BlockIq2S::quantize_weighted),
            "IQ1_S" => encode_rows(&x, w, BlockIq1S::quantize_weighted),
            "IQ1_M" => encode_rows(&x, w, BlockIq1M::quantize_weighted),
            _ => panic!("unknown type {ty}"),
        };
        let diff = got.iter().zip(&expected).filter(|(a, b)| a != b).count();
        assert!(
            got == expected,
            "{ty} ({weights}): {diff} of {} bytes differ",
            expected.len()
        );
        checked += 1;
    }
    assert_eq!(checked, 11);
}
