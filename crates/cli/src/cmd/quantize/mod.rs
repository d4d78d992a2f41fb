//! `minfer quantize IN OUT TYPE`: llama-quantize's job. TYPE is one of llama-quantize's
//! file types (`Q4_K_M`, `IQ4_XS`, ...), and each tensor gets the type llama-quantize's
//! rule gives it in that mix ([`mix`]); metadata is copied and `general.file_type` set as
//! llama.cpp sets it.
//!
//! With `--imatrix FILE` (llama-imatrix's output, [`imatrix`]) each matrix with an entry
//! is encoded with its per-column importance weights by the encoders ggml gives them to
//! (`minfer_gguf::quant::uses_importance`), and the rule takes its imatrix branches; as
//! llama-quantize, a matrix that needs weights but has no entry is refused. Without one,
//! the types llama-quantize refuses to write unweighted (IQ1_*, IQ2_*, IQ3_XXS, Q2_K in
//! Q2_K_S) are written with the gguf crate's fallback weights, and a warning says so.

pub mod imatrix;
pub mod mix;

use anyhow::{bail, Context, Result};
use clap::Parser;
use imatrix::Imatrix;
use minfer_gguf::quant::{dequantize_to_vec, quantize_rows_weighted, quantize_to_vec};
use minfer_gguf::{GgmlType, GgufFile, GgufWriter, MetaValue};
use mix::{parse_ftype, requires_imatrix, Mix, ModelFacts};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

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
    /// An importance matrix from llama.cpp's llama-imatrix (GGUF or legacy .dat): the
    /// encoders weight each column by it, as llama-quantize's flag of the same name.
    #[arg(long, value_name = "FILE")]
    imatrix: Option<PathBuf>,
    /// Use the importance matrix only for tensors whose names contain NAME (repeatable).
    #[arg(long, value_name = "NAME", requires = "imatrix")]
    include_weights: Vec<String>,
    /// Do not use the importance matrix for tensors whose names contain NAME (repeatable).
    #[arg(long, value_name = "NAME", requires = "imatrix")]
    exclude_weights: Vec<String>,
}

/// Encodes `x` (whole rows of `row` values) as `ty`, the rows split over the machine's
/// threads: the encoders are per row, so the bytes are those of one serial pass. With
/// importance weights `qw` (`row` values per expert, the experts' rows `expert_rows` each),
/// each row is encoded with its expert's weights.
fn encode_rows(
    ty: GgmlType,
    x: &[f32],
    row: usize,
    qw: Option<&[f32]>,
    expert_rows: usize,
) -> Result<Vec<u8>> {
    let row = row.max(1);
    let rows = x.len() / row;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Small tensors are not worth a thread each.
    let per = rows.div_ceil(threads).max((1 << 16) / row).max(1);
    // Jobs never cross an expert's rows, so each has one row of weights.
    let mut jobs: Vec<(&[f32], Option<&[f32]>)> = Vec::new();
    for (e, xe) in x.chunks(expert_rows.max(1) * row).enumerate() {
        let w = qw.and_then(|q| q.get(e * row..(e + 1) * row));
        jobs.extend(xe.chunks(per * row).map(|c| (c, w)));
    }
    let next = AtomicUsize::new(0);
    let parts: Vec<Mutex<Option<Result<Vec<u8>, _>>>> =
        jobs.iter().map(|_| Mutex::new(None)).collect();
    std::thread::scope(|s| {
        for _ in 0..threads.min(jobs.len()) {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(&(c, w)) = jobs.get(i) else { break };
                let r = match w {
                    Some(w) => quantize_rows_weighted(ty, c, row, w),
                    None => quantize_to_vec(ty, c),
                };
                *parts[i].lock().unwrap_or_else(|p| p.into_inner()) = Some(r);
            });
        }
    });
    let mut out = Vec::new();
    for p in parts {
        let p = p.into_inner().unwrap_or_else(|p| p.into_inner());
        out.extend_from_slice(&p.context("an encoder thread stopped")??);
    }
    Ok(out)
}

/// The first `max` bytes of `s` at most, cut at a character boundary (llama-quantize
/// keeps 127 bytes of the strings it records).
fn clip(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// Loads `--imatrix` with its filters; `None` without the flag or when the filters leave
/// no entry (llama-quantize then quantizes as without one).
fn load_imatrix(args: &Args) -> Result<Option<Imatrix>> {
    let Some(path) = &args.imatrix else {
        return Ok(None);
    };
    let mut m = Imatrix::load(path)?;
    m.filter(&args.include_weights, &args.exclude_weights);
    if m.entries.is_empty() {
        eprintln!(
            "warning: no importance matrix entry is left after --include-weights/--exclude-weights"
        );
        return Ok(None);
    }
    eprintln!(
        "importance matrix {}: {} entries, {} chunks of {}",
        path.display(),
        m.entries.len(),
        m.chunk_count,
        m.datasets.first().map_or("an unnamed text", String::as_str)
    );
    Ok(Some(m))
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
    let imatrix = load_imatrix(&args)?;
    let types = Mix::new(ftype, args.pure, ModelFacts::of(&file), file.tensors())
        .imatrix(imatrix.is_some())
        .types(file.tensors());
    let needs = |i: usize| {
        let t = &file.tensors()[i];
        types[i] != t.ggml_type && requires_imatrix(&t.name, types[i], &ftype)
    };
    if imatrix.is_none() {
        if let Some(i) = (0..types.len()).find(|&i| needs(i)) {
            eprintln!(
                "warning: {} puts {} on {} (and maybe others), which llama-quantize writes only \
                 with an importance matrix (--imatrix); without one the result is much worse",
                ftype.name,
                types[i],
                file.tensors()[i].name
            );
        }
    }
    let mut w = GgufWriter::new();
    for (key, value) in file.metadata() {
        w.add_meta(key, value.clone());
    }
    w.add_meta("general.file_type", MetaValue::U32(ftype.id));
    if ftype.default.is_quantized() {
        w.add_meta("general.quantization_version", MetaValue::U32(2));
    }
    if let (Some(m), Some(path)) = (&imatrix, &args.imatrix) {
        let path = path.to_string_lossy();
        w.add_meta("quantize.imatrix.file", MetaValue::String(clip(&path, 127)));
        if let Some(ds) = m.datasets.first() {
            w.add_meta("quantize.imatrix.dataset", MetaValue::String(clip(ds, 127)));
        }
        let n = u32::try_from(m.entries.len()).unwrap_or(u32::MAX);
        w.add_meta("quantize.imatrix.entries_count", MetaValue::U32(n));
        if m.chunk_count > 0 {
            w.add_meta(
                "quantize.imatrix.chunks_count",
                MetaValue::U32(m.chunk_count),
            );
        }
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
            let qw = match &imatrix {
                Some(m) => m.weights_for(t)?,
                None => None,
            };
            if imatrix.is_some() && qw.is_none() && needs(i) {
                bail!(
                    "the importance matrix has no entry for {}, which {} writes as {ty}: \
                     without one the result is garbage (llama-quantize refuses it too)",
                    t.name,
                    ftype.name
                );
            }
            let x = dequantize_to_vec(t.ggml_type, src, n_el)
                .with_context(|| format!("cannot decode tensor {} ({})", t.name, t.ggml_type))?;
            let expert_rows = t.dims.get(1).copied().unwrap_or(1) as usize;
            encode_rows(ty, &x, row as usize, qw, expert_rows)
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
                encode_rows(ty, &x, 256, None, 300).unwrap(),
                quantize_to_vec(ty, &x).unwrap()
            );
        }
        // With weights, per expert: 3 experts of 100 rows each.
        let qw: Vec<f32> = (0..256 * 3).map(|i| 1.0 + (i % 7) as f32).collect();
        for ty in [Iq2Xxs, Iq3S] {
            let mut want = Vec::new();
            for (e, xe) in x.chunks(256 * 100).enumerate() {
                let w = &qw[e * 256..(e + 1) * 256];
                want.extend(quantize_rows_weighted(ty, xe, 256, w).unwrap());
            }
            assert_eq!(encode_rows(ty, &x, 256, Some(&qw), 100).unwrap(), want);
        }
    }
}
