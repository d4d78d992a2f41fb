//! `minfer quantize IN OUT TYPE`: llama-quantize's job. TYPE is one of llama-quantize's
//! file types (`Q4_K_M`, `IQ4_XS`, ...), and each tensor gets the type llama-quantize's
//! rule gives it in that mix ([`mix`]); metadata is copied and `general.file_type` set as
//! llama.cpp sets it.
//!
//! There is no importance matrix: the lattice i-quants are encoded with the weights the
//! gguf crate uses without one (for IQ2_XXS, IQ2_XS, IQ1_S and IQ1_M, which
//! llama-quantize refuses without one, quality suffers).

pub mod mix;

use anyhow::{bail, Context, Result};
use clap::Parser;
use minfer_gguf::quant::{dequantize_to_vec, quantize_to_vec};
use minfer_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use mix::{parse_ftype, Mix, ModelFacts};
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
    /// llama-quantize's file type (Q4_K_M, Q8_0, IQ4_XS, ...; case-insensitive): the
    /// default type of the weight matrices and its rule for raising some of them.
    #[arg(value_name = "TYPE")]
    ty: String,
    /// Give every weight matrix TYPE's default type, without the mix's raised tensors
    /// (llama-quantize's flag of the same name).
    #[arg(long)]
    pure: bool,
    /// Accept an already quantized IN: its tensors are dequantized first (quality loss
    /// adds up, as with llama-quantize's flag of the same name).
    #[arg(long)]
    allow_requantize: bool,
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
    let ftype = parse_ftype(&args.ty)?;
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
    let types =
        Mix::new(ftype, args.pure, ModelFacts::of(&file), file.tensors()).types(file.tensors());
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.add_meta(key, value.clone());
    }
    w.add_meta("general.file_type", MetaValue::U32(ftype.id));
    if ftype.default.is_quantized() {
        w.add_meta("general.quantization_version", MetaValue::U32(2));
    }
    let n = file.tensors().len();
    let (mut bytes_in, mut bytes_out) = (0u64, 0u64);
    for (i, t) in file.tensors().iter().enumerate() {
        let row = t.dims.first().copied().unwrap_or(1);
        let ty = types[i];
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
        "wrote {} ({}): tensor data {:.2} MiB -> {:.2} MiB",
        args.output.display(),
        ftype.name,
        bytes_in as f64 / (1 << 20) as f64,
        bytes_out as f64 / (1 << 20) as f64
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use GgmlType::*;

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
}
