//! `minfer quantize IN OUT TYPE`: llama-quantize's job. Every tensor minfer can encode in
//! TYPE is re-encoded, except those llama-quantize keeps in higher precision; metadata is
//! copied and `general.file_type` set as llama.cpp sets it.
//!
//! Of llama-quantize's low-bit i-quant mixes only the output and embedding rules are
//! followed: every other matrix takes TYPE, where llama-quantize raises some (the value
//! projections, the first eighth of `ffn_down`, ...). There is no importance matrix: the
//! lattice i-quants are encoded with the weights the gguf crate uses without one (for
//! IQ2_XXS, IQ2_XS and IQ1_S, which llama-quantize refuses without one, quality suffers).

use anyhow::{bail, Context, Result};
use clap::Parser;
use minfer_gguf::quant::{dequantize_to_vec, has_quantizer, quantize_to_vec};
use minfer_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue, TensorInfo, ALL_TYPES, QK_K};
use std::path::{Path, PathBuf};

/// Arguments of `minfer quantize`.
#[derive(Parser)]
pub struct Args {
    /// The GGUF file to read (F32, F16 or BF16 weights; quantized ones with
    /// --allow-requantize).
    #[arg(value_name = "IN")]
    input: PathBuf,
    /// The GGUF file to write (must not be IN).
    #[arg(value_name = "OUT")]
    output: PathBuf,
    /// The type of the weight matrices (Q8_0, Q4_K, IQ4_XS, ...; case-insensitive).
    #[arg(value_name = "TYPE")]
    ty: String,
    /// Accept an already quantized IN: its tensors are dequantized first (quality loss
    /// adds up, as with llama-quantize's flag of the same name).
    #[arg(long)]
    allow_requantize: bool,
}

/// Whether minfer can write whole files of `ty`: a type with an encoder that ggml stores
/// in model files (Q8_K is an activation type only; llama-quantize offers no file of it).
fn encodable(ty: GgmlType) -> bool {
    has_quantizer(ty) && ty != GgmlType::Q8K
}

/// llama.cpp's `general.file_type` (`llama_ftype`) for a file whose matrices are `ty`;
/// the k-quants map to their `_S` mixes, the ones whose default type is `ty` throughout.
fn file_type(ty: GgmlType) -> u32 {
    match ty {
        GgmlType::F32 => 0,
        GgmlType::F16 => 1,
        GgmlType::Q4_0 => 2,
        GgmlType::Q4_1 => 3,
        GgmlType::Q8_0 => 7,
        GgmlType::Q5_0 => 8,
        GgmlType::Q5_1 => 9,
        GgmlType::Q2K => 10,
        GgmlType::Q3K => 11,
        GgmlType::Q4K => 14,
        GgmlType::Q5K => 16,
        GgmlType::Q6K => 18,
        GgmlType::Iq2Xxs => 19,
        GgmlType::Iq2Xs => 20,
        GgmlType::Iq3Xxs => 23,
        GgmlType::Iq1S => 24,
        GgmlType::Iq4Nl => 25,
        GgmlType::Iq3S => 26,
        // IQ2_M is the mix whose default type is IQ2_S (the IQ2_S mix defaults to IQ2_XS).
        GgmlType::Iq2S => 29,
        GgmlType::Iq4Xs => 30,
        GgmlType::BF16 => 32,
        GgmlType::Tq1_0 => 36,
        GgmlType::Tq2_0 => 37,
        GgmlType::Mxfp4 => 38,
        GgmlType::Iq1M => 31,
        // Not reachable for an encodable target; llama.cpp's "guessed" marker otherwise.
        _ => 1024,
    }
}

/// Parses TYPE, refusing unknown and decode-only types with the list of encodable ones.
fn parse_type(s: &str) -> Result<GgmlType> {
    let list = || {
        ALL_TYPES
            .iter()
            .filter(|t| encodable(**t))
            .map(|t| t.name())
            .collect::<Vec<_>>()
            .join(", ")
    };
    match GgmlType::from_name(s) {
        None => bail!("unknown type `{s}`; minfer can write: {}", list()),
        Some(GgmlType::Q8K) => bail!(
            "type Q8_K holds activations, not model files; minfer can write: {}",
            list()
        ),
        Some(t) if !encodable(t) => bail!(
            "type {t} is decode-only in minfer (it reads {t} files but has no encoder for it); \
             it can write: {}",
            list()
        ),
        Some(t) => Ok(t),
    }
}

/// Whether llama-quantize would quantize the tensor at all: weight matrices only, never
/// norms, 1-D tensors, the MoE router, position/type embeddings or the recurrent-state
/// parameters (small, and sensitive to precision).
fn is_quantizable(t: &TensorInfo) -> bool {
    const KEEP: [&str; 12] = [
        "_norm.weight",
        "ffn_gate_inp.weight",
        "pos_embd.weight",
        "token_types.weight",
        "ssm_conv1d.weight",
        "attn_rel_b.weight",
        "time_mix_first.weight",
        "time_mix_w1.weight",
        "time_mix_w2.weight",
        "time_mix_decay_w1.weight",
        "time_mix_decay_w2.weight",
        "time_mix_lerp_fused.weight",
    ];
    // ggml's dimension count: trailing sizes of 1 do not count.
    let n_dims = t.dims.iter().rposition(|d| *d > 1).map_or(1, |i| i + 1);
    t.name.ends_with("weight") && n_dims >= 2 && !KEEP.iter().any(|k| t.name.ends_with(k))
}

/// The type llama-quantize gives one quantizable tensor of a `target` file: the output
/// matrix (or the tied embedding that serves as it) Q6_K, or Q8_0 where the target is
/// Q8_0 or rows do not fill the target's blocks; the embedding of the ternary types Q4_K;
/// MXFP4 only for the expert matrices (the rest Q8_0, as its MoE mix does); the low-bit
/// i-quants' output Q5_K and embedding Q2_K (IQ1, IQ2_XXS, IQ2_XS) or IQ3_S (IQ2_S,
/// IQ3_XXS); then the fallback for rows that are not a whole number of blocks.
fn tensor_type(target: GgmlType, name: &str, row: u64, has_output: bool) -> GgmlType {
    use GgmlType::{Iq1M, Iq1S, Iq2S, Iq2Xs, Iq2Xxs, Iq3Xxs};
    let is_output = name == "output.weight" || (!has_output && name == "token_embd.weight");
    let mut ty = target;
    if target.is_quantized() {
        if is_output {
            ty = if target == GgmlType::Mxfp4 || !row.is_multiple_of(target.block_size() as u64) {
                GgmlType::Q8_0
            } else if matches!(target, Iq2Xxs | Iq2Xs | Iq3Xxs | Iq1S | Iq2S | Iq1M) {
                GgmlType::Q5K
            } else if target != GgmlType::Q8_0 {
                GgmlType::Q6K
            } else {
                target
            };
        } else if name == "token_embd.weight" {
            ty = match target {
                GgmlType::Tq1_0 | GgmlType::Tq2_0 => GgmlType::Q4K,
                Iq2Xxs | Iq2Xs | Iq1S | Iq1M => GgmlType::Q2K,
                Iq2S | Iq3Xxs => GgmlType::Iq3S,
                _ => target,
            };
        } else if target == GgmlType::Mxfp4 && !name.contains("_exps") {
            ty = GgmlType::Q8_0;
        }
    }
    incompatible_fallback(ty, row)
}

/// llama-quantize's replacement for a type whose blocks do not divide the row length:
/// the 256-blocks go to a 32-block type of similar size, and F16 where even that fails.
fn incompatible_fallback(ty: GgmlType, row: u64) -> GgmlType {
    if row.is_multiple_of(ty.block_size() as u64) {
        return ty;
    }
    let ty = if ty.block_size() == QK_K {
        match ty {
            GgmlType::Q4K => GgmlType::Q5_0,
            GgmlType::Q5K => GgmlType::Q5_1,
            GgmlType::Q6K => GgmlType::Q8_0,
            _ => GgmlType::Iq4Nl,
        }
    } else {
        ty
    };
    if row.is_multiple_of(ty.block_size() as u64) {
        ty
    } else {
        GgmlType::F16
    }
}

/// Encodes `x` (whole rows of `row` values) as `ty`, the rows split over the machine's
/// threads: the encoders are per block, so the bytes are those of one serial pass.
fn encode_rows(ty: GgmlType, x: &[f32], row: usize) -> Result<Vec<u8>> {
    let rows = x.len() / row.max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Small tensors are not worth a thread each.
    let per = rows.div_ceil(threads).max((1 << 16) / row.max(1)).max(1);
    let parts: Vec<Result<Vec<u8>, _>> = std::thread::scope(|s| {
        let handles: Vec<_> = x
            .chunks(per * row.max(1))
            .map(|c| s.spawn(move || quantize_to_vec(ty, c)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
            .collect()
    });
    let mut out = Vec::new();
    for p in parts {
        out.extend_from_slice(&p?);
    }
    Ok(out)
}

/// Whether `a` and `b` name the same file (`b` need not exist yet).
fn same_file(a: &Path, b: &Path) -> bool {
    match (a.canonicalize(), b.canonicalize()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// Runs `minfer quantize`.
pub fn run(args: Args) -> Result<()> {
    let target = parse_type(&args.ty)?;
    if same_file(&args.input, &args.output) {
        bail!(
            "OUT is IN ({}): write the quantized model to another file",
            args.input.display()
        );
    }
    let file = GgufFile::open(&args.input)
        .with_context(|| format!("cannot read {}", args.input.display()))?;
    if !args.allow_requantize {
        if let Some(t) = file.tensors().iter().find(|t| t.ggml_type.is_quantized()) {
            bail!(
                "{} is already quantized (tensor {} is {}); requantizing loses more quality, \
                 pass --allow-requantize to do it anyway",
                args.input.display(),
                t.name,
                t.ggml_type
            );
        }
    }
    let has_output = file.tensor("output.weight").is_some();
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.add_meta(key, value.clone());
    }
    w.add_meta("general.file_type", MetaValue::U32(file_type(target)));
    if target.is_quantized() {
        w.add_meta("general.quantization_version", MetaValue::U32(2));
    }
    let n = file.tensors().len();
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for (i, t) in file.tensors().iter().enumerate() {
        let row = t.dims.first().copied().unwrap_or(1);
        let ty = if is_quantizable(t) {
            tensor_type(target, &t.name, row, has_output)
        } else {
            t.ggml_type
        };
        let src = file.tensor_data(t);
        let data = if ty == t.ggml_type {
            src.to_vec()
        } else {
            let n_el = usize::try_from(t.n_elements())
                .with_context(|| format!("tensor {} is too large", t.name))?;
            let x = dequantize_to_vec(t.ggml_type, src, n_el)
                .with_context(|| format!("cannot decode tensor {} ({})", t.name, t.ggml_type))?;
            encode_rows(ty, &x, row as usize)
                .with_context(|| format!("cannot encode tensor {} as {ty}", t.name))?
        };
        // Tell the user each step of what can be minutes of work.
        eprintln!(
            "[{:>w$}/{n}] {:<32} {:<20} {:>7} -> {:<7} {:>10.2} MiB -> {:.2} MiB",
            i + 1,
            t.name,
            format!("{:?}", t.dims),
            t.ggml_type.name(),
            ty.name(),
            src.len() as f64 / (1 << 20) as f64,
            data.len() as f64 / (1 << 20) as f64,
            w = n.to_string().len(),
        );
        bytes_in += src.len() as u64;
        bytes_out += data.len() as u64;
        w.add_tensor_bytes(&t.name, &t.dims, ty, data)
            .with_context(|| format!("cannot add tensor {}", t.name))?;
        file.release_pages(t);
    }
    w.write_to(&args.output)
        .with_context(|| format!("cannot write {}", args.output.display()))?;
    eprintln!(
        "wrote {} ({target}): tensor data {:.2} MiB -> {:.2} MiB",
        args.output.display(),
        bytes_in as f64 / (1 << 20) as f64,
        bytes_out as f64 / (1 << 20) as f64
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

    fn info(name: &str, dims: &[u64]) -> TensorInfo {
        TensorInfo {
            name: name.into(),
            dims: dims.to_vec(),
            ggml_type: F32,
            offset: 0,
            n_bytes: 0,
        }
    }

    #[test]
    fn types_are_parsed_or_refused_by_name() {
        assert_eq!(parse_type("iq4_xs").unwrap(), Iq4Xs);
        assert_eq!(parse_type("Q8_0").unwrap(), Q8_0);
        let e = parse_type("Q4_K_M").unwrap_err().to_string();
        assert!(
            e.contains("unknown type `Q4_K_M`") && e.contains("IQ4_NL"),
            "{e}"
        );
        assert!(e.contains("IQ2_XXS") && !e.contains("Q8_K"), "{e}");
        assert_eq!(parse_type("iq2_xxs").unwrap(), Iq2Xxs);
        assert_eq!(parse_type("IQ1_M").unwrap(), Iq1M);
        let e = parse_type("q8_k").unwrap_err().to_string();
        assert!(e.contains("Q8_K holds activations"), "{e}");
    }

    #[test]
    fn matrices_are_quantized_and_the_rest_kept() {
        assert!(is_quantizable(&info("blk.0.attn_q.weight", &[256, 256])));
        assert!(is_quantizable(&info("token_embd.weight", &[256, 512])));
        assert!(!is_quantizable(&info("blk.0.attn_norm.weight", &[256])));
        assert!(!is_quantizable(&info("blk.0.attn_q.bias", &[256])));
        assert!(!is_quantizable(&info(
            "blk.0.ffn_gate_inp.weight",
            &[256, 8]
        )));
        assert!(!is_quantizable(&info("rope_freqs.weight", &[64])));
        assert!(!is_quantizable(&info("blk.0.x.weight", &[256, 1])));
    }

    #[test]
    fn llama_quantize_type_rules() {
        // Body matrices take the target; the output Q6_K (Q8_0 for a Q8_0 file).
        assert_eq!(tensor_type(Q4K, "blk.0.attn_q.weight", 256, true), Q4K);
        assert_eq!(tensor_type(Q4K, "output.weight", 256, true), Q6K);
        assert_eq!(tensor_type(Q8_0, "output.weight", 256, true), Q8_0);
        assert_eq!(tensor_type(Iq4Xs, "token_embd.weight", 256, true), Iq4Xs);
        // A tied embedding is the output.
        assert_eq!(tensor_type(Iq4Xs, "token_embd.weight", 256, false), Q6K);
        // Rows that do not fill the blocks.
        assert_eq!(tensor_type(Q4K, "blk.0.attn_q.weight", 128, true), Q5_0);
        assert_eq!(tensor_type(Q6K, "blk.0.attn_q.weight", 128, true), Q8_0);
        assert_eq!(tensor_type(Iq4Xs, "blk.0.attn_q.weight", 128, true), Iq4Nl);
        assert_eq!(tensor_type(Iq4Nl, "output.weight", 128, true), Q8_0);
        assert_eq!(tensor_type(Q4K, "output.weight", 96, true), Q8_0);
        assert_eq!(tensor_type(Q8_0, "blk.0.attn_q.weight", 40, true), F16);
        // Ternary embeddings and the MXFP4 MoE mix.
        assert_eq!(tensor_type(Tq2_0, "token_embd.weight", 256, true), Q4K);
        assert_eq!(
            tensor_type(Mxfp4, "blk.0.ffn_up_exps.weight", 256, true),
            Mxfp4
        );
        assert_eq!(tensor_type(Mxfp4, "blk.0.attn_q.weight", 256, true), Q8_0);
        // The low-bit i-quant mixes: output Q5_K (IQ3_S keeps Q6_K), embedding Q2_K or
        // IQ3_S, 128-rows IQ4_NL.
        assert_eq!(
            tensor_type(Iq2Xxs, "blk.0.attn_q.weight", 256, true),
            Iq2Xxs
        );
        assert_eq!(tensor_type(Iq2Xxs, "output.weight", 256, true), Q5K);
        assert_eq!(tensor_type(Iq1M, "token_embd.weight", 256, false), Q5K);
        assert_eq!(tensor_type(Iq3S, "output.weight", 256, true), Q6K);
        assert_eq!(tensor_type(Iq1S, "token_embd.weight", 256, true), Q2K);
        assert_eq!(tensor_type(Iq3Xxs, "token_embd.weight", 256, true), Iq3S);
        assert_eq!(tensor_type(Iq3S, "token_embd.weight", 256, true), Iq3S);
        assert_eq!(tensor_type(Iq2S, "blk.0.ffn_up.weight", 128, true), Iq4Nl);
        // Float targets take every matrix.
        assert_eq!(tensor_type(F16, "output.weight", 100, true), F16);
    }

    /// The threaded encoder writes the bytes of one serial pass.
    #[test]
    fn rows_split_over_threads_encode_as_one_pass() {
        let x: Vec<f32> = (0..256 * 300)
            .map(|i| ((i * 7919) % 1000) as f32 / 500.0 - 1.0)
            .collect();
        for ty in [Q8_0, Q4K, Iq4Xs] {
            assert_eq!(
                encode_rows(ty, &x, 256).unwrap(),
                quantize_to_vec(ty, &x).unwrap()
            );
        }
    }

    #[test]
    fn file_types_follow_llama_cpp() {
        assert_eq!(file_type(Q8_0), 7);
        assert_eq!(file_type(Q4K), 14);
        assert_eq!(file_type(Iq4Nl), 25);
        assert_eq!(file_type(Iq4Xs), 30);
        assert_eq!(file_type(BF16), 32);
        assert_eq!(file_type(Iq2Xxs), 19);
        assert_eq!(file_type(Iq2S), 29);
        assert_eq!(file_type(Iq1M), 31);
        for t in ALL_TYPES.iter().filter(|t| encodable(**t)) {
            assert_ne!(file_type(*t), 1024, "{t}");
        }
    }
}
