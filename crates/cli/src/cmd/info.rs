//! `minfer info`: what a GGUF model file holds, as a readable report or one JSON object.

use anyhow::Context;
use minfer_gguf::{GgmlType, GgufFile, MetaValue};
use minfer_graph::{Backend, BackendEntry};
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::path::Path;

/// Arguments of `minfer info`.
#[derive(clap::Args)]
pub struct Args {
    /// Model: a GGUF path, a catalog name or an http(s) URL (default: the catalog default).
    #[arg(short = 'm', long = "model")]
    pub model: Option<String>,
    /// Print one JSON object instead of the human-readable report.
    #[arg(long)]
    pub json: bool,
}

/// Arrays longer than this are summarised by element type and length in `--json`.
const JSON_ARRAY_LIMIT: usize = 16;

/// Special-token ids the tokenizer summary reports, by label.
const SPECIAL_TOKENS: [(&str, &str); 4] = [
    ("bos", "tokenizer.ggml.bos_token_id"),
    ("eos", "tokenizer.ggml.eos_token_id"),
    ("padding", "tokenizer.ggml.padding_token_id"),
    ("eot", "tokenizer.ggml.eot_token_id"),
];

/// Runs the subcommand.
pub fn run(args: Args) -> anyhow::Result<()> {
    let env = super::common::EnvOptions::get();
    let path = minfer_hub::resolve_model(args.model.as_deref(), &env.hub, true)?;
    let file = GgufFile::open(&path).with_context(|| format!("cannot load {}", path.display()))?;
    // This build's backends, each probed once (the adapter a GPU backend would use).
    let registry = minfer_runtime::backends::registry(&minfer_graph::BackendConfig {
        options: env.backend_options,
        ..minfer_graph::BackendConfig::default()
    })?;
    let default = registry.select(None).backends;
    let backends: Vec<&BackendEntry> = registry
        .identity_order()
        .into_iter()
        .filter(|e| e.compiled)
        .collect();
    let params = super::params::ParamSummary::of(&file);
    let report = if args.json {
        let mut j = json_report(&path, &file);
        j["parameters"] = params.as_ref().map_or(Value::Null, |p| p.json());
        j["backends"] = backends_json(&backends, &default);
        let mut s = serde_json::to_string_pretty(&j)?;
        s.push('\n');
        s
    } else {
        let mut s = text_report(&path, &file);
        if let Some(p) = &params {
            s.push_str(&p.text());
        }
        s.push_str(&backends_text(&backends, &default));
        s
    };
    let mut out = std::io::stdout().lock();
    match out.write_all(report.as_bytes()).and_then(|()| out.flush()) {
        // A closed pipe (`minfer info | head`) is the reader's choice, not a failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// How a compiled backend stands on this machine, in words.
fn backend_status(e: &BackendEntry, default: &[Backend]) -> String {
    match &e.usable {
        Err(reason) => format!("not usable: {reason}"),
        Ok(()) if default.contains(&e.id) => "used by default".into(),
        Ok(()) => format!("used only with --backend {}", e.name),
    }
}

/// The `backends:` section: every backend of this build, whether it runs here, and
/// its device (for a GPU backend, the adapter: name, API, class, driver).
fn backends_text(backends: &[&BackendEntry], default: &[Backend]) -> String {
    let mut s = String::from("\nbackends:\n");
    for e in backends {
        let _ = write!(s, "  {:<6} {}", e.name, backend_status(e, default));
        match (&e.detail, &e.device) {
            (Some(d), _) => {
                let _ = write!(s, "; {} ({}, {}", d.name, d.api, d.device_type);
                if !d.driver.is_empty() {
                    let _ = write!(s, ", {}", d.driver);
                }
                s.push(')');
                if d.emulated {
                    s.push_str(", a CPU emulation");
                }
                let limits: Vec<String> = [
                    ("largest buffer", d.max_buffer_bytes),
                    ("largest storage binding", d.max_binding_bytes),
                ]
                .into_iter()
                .filter_map(|(what, b)| b.map(|b| format!("{what} {}", mib(b))))
                .collect();
                if !limits.is_empty() {
                    let _ = write!(s, "; limits: {}", limits.join(", "));
                }
            }
            (None, Some(device)) => {
                let _ = write!(s, "; {device}");
            }
            (None, None) => {}
        }
        s.push('\n');
    }
    s
}

/// A device limit in bytes as MiB, with the exact count where that is not whole.
fn mib(bytes: u64) -> String {
    let m = bytes as f64 / (1u64 << 20) as f64;
    if bytes.is_multiple_of(1 << 20) {
        format!("{m:.0} MiB")
    } else {
        format!("{m:.1} MiB ({bytes} bytes)")
    }
}

/// The backends section of `--json`: one object per compiled backend.
fn backends_json(backends: &[&BackendEntry], default: &[Backend]) -> Value {
    backends
        .iter()
        .map(|e| {
            json!({
                "name": e.name,
                "usable": e.usable.is_ok(),
                "reason": e.usable.as_ref().err(),
                "default": default.contains(&e.id),
                "device": e.device,
                "detail": e.detail,
            })
        })
        .collect()
}

/// Per-type tensor count and byte total, in type-id order.
fn type_totals(file: &GgufFile) -> BTreeMap<GgmlType, (usize, u64)> {
    let mut totals = BTreeMap::new();
    for t in file.tensors() {
        let e = totals.entry(t.ggml_type).or_insert((0, 0));
        e.0 += 1;
        e.1 += t.n_bytes;
    }
    totals
}

/// `{arch}.*` keys with the prefix stripped, in file order.
fn hparams(file: &GgufFile) -> Vec<(&str, &MetaValue)> {
    let Some(arch) = file.architecture() else {
        return Vec::new();
    };
    file.metadata()
        .iter()
        .filter_map(|(k, v)| {
            k.strip_prefix(arch)
                .and_then(|rest| rest.strip_prefix('.'))
                .map(|name| (name, v))
        })
        .collect()
}

fn tokens(file: &GgufFile) -> &[MetaValue] {
    file.get("tokenizer.ggml.tokens")
        .and_then(MetaValue::as_array)
        .unwrap_or(&[])
}

/// A special token's id and text, when the id key is present and an integer.
fn special_token<'a>(file: &'a GgufFile, key: &str) -> Option<(u64, Option<&'a str>)> {
    let id = file.get(key)?.as_u64()?;
    let text = usize::try_from(id)
        .ok()
        .and_then(|i| tokens(file).get(i))
        .and_then(MetaValue::as_str);
    Some((id, text))
}

fn array_len(file: &GgufFile, key: &str) -> Option<usize> {
    file.get(key).and_then(MetaValue::as_array).map(<[_]>::len)
}

fn shape(dims: &[u64]) -> String {
    let parts: Vec<String> = dims.iter().map(u64::to_string).collect();
    format!("[{}]", parts.join(", "))
}

fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} B");
    }
    let mut v = n as f64;
    let mut unit = "B";
    for u in UNITS {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    format!("{v:.1} {unit}")
}

fn text_report(path: &Path, file: &GgufFile) -> String {
    let mut s = String::new();
    // Writing into a String cannot fail; the results are ignored for brevity.
    let _ = writeln!(s, "file:          {}", path.display());
    let _ = writeln!(s, "GGUF version:  {}", file.version());
    let _ = writeln!(
        s,
        "file size:     {} bytes ({})",
        file.file_size(),
        human_bytes(file.file_size())
    );
    let _ = writeln!(
        s,
        "alignment:     {} (data section at byte {})",
        file.alignment(),
        file.data_offset()
    );
    if let Some(name) = file.get("general.name").and_then(MetaValue::as_str) {
        let _ = writeln!(s, "name:          {name}");
    }
    let _ = writeln!(
        s,
        "\narchitecture:  {}",
        file.architecture().unwrap_or("(none)")
    );
    let hp = hparams(file);
    let width = hp.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (name, v) in hp {
        let _ = writeln!(s, "  {name:<width$}  {v}");
    }

    let _ = writeln!(s, "\ntokenizer:");
    let str_key = |k| file.get(k).and_then(MetaValue::as_str).unwrap_or("(none)");
    let _ = writeln!(s, "  model          {}", str_key("tokenizer.ggml.model"));
    let _ = writeln!(s, "  pre            {}", str_key("tokenizer.ggml.pre"));
    let _ = writeln!(s, "  vocab size     {}", tokens(file).len());
    for (label, key) in SPECIAL_TOKENS {
        if let Some((id, text)) = special_token(file, key) {
            let text = text.map_or_else(|| "(out of range)".into(), |t| format!("{t:?}"));
            let _ = writeln!(s, "  {label:<14} {id} {text}");
        }
    }
    let template = file
        .get("tokenizer.chat_template")
        .and_then(MetaValue::as_str);
    let _ = writeln!(
        s,
        "  chat template  {}",
        template.map_or("absent".into(), |t| format!("present ({} bytes)", t.len()))
    );
    let merges = array_len(file, "tokenizer.ggml.merges");
    let _ = writeln!(s, "  merges         {}", merges.unwrap_or(0));

    let _ = writeln!(s, "\ntensors ({}):", file.tensors().len());
    let name_w = file
        .tensors()
        .iter()
        .map(|t| t.name.len())
        .max()
        .unwrap_or(0)
        .max(4);
    let _ = writeln!(
        s,
        "  {:<name_w$}  {:<5}  {:<20}  {:>12}",
        "name", "type", "shape", "bytes"
    );
    for t in file.tensors() {
        let _ = writeln!(
            s,
            "  {:<name_w$}  {:<5}  {:<20}  {:>12}",
            t.name,
            t.ggml_type.name(),
            shape(&t.dims),
            t.n_bytes
        );
    }

    // Seven columns fit the longest type name (IQ2_XXS).
    let _ = writeln!(s, "\nper type:");
    let mut total = 0;
    for (ty, (count, bytes)) in type_totals(file) {
        total += bytes;
        let _ = writeln!(
            s,
            "  {:<7}  {count:>4} tensors  {bytes:>12} bytes ({})",
            ty.name(),
            human_bytes(bytes)
        );
    }
    let _ = writeln!(
        s,
        "  total    {:>4} tensors  {total:>12} bytes ({}); file size {} bytes",
        file.tensors().len(),
        human_bytes(total),
        file.file_size()
    );
    s
}

/// A metadata value as JSON, with long arrays summarised.
fn meta_json(v: &MetaValue) -> Value {
    match v {
        MetaValue::U8(x) => json!(x),
        MetaValue::I8(x) => json!(x),
        MetaValue::U16(x) => json!(x),
        MetaValue::I16(x) => json!(x),
        MetaValue::U32(x) => json!(x),
        MetaValue::I32(x) => json!(x),
        MetaValue::U64(x) => json!(x),
        MetaValue::I64(x) => json!(x),
        // Through the shortest decimal form, so 1e-6f32 prints as 1e-6 rather than its
        // exact f64 widening; non-finite floats have no JSON spelling and become null.
        MetaValue::F32(x) => json!(x.to_string().parse::<f64>().ok()),
        MetaValue::F64(x) => json!(x),
        MetaValue::Bool(x) => json!(x),
        MetaValue::String(x) => json!(x),
        MetaValue::Array(ty, items) if items.len() > JSON_ARRAY_LIMIT => {
            json!({ "type": ty.name(), "len": items.len() })
        }
        MetaValue::Array(_, items) => Value::Array(items.iter().map(meta_json).collect()),
    }
}

fn json_report(path: &Path, file: &GgufFile) -> Value {
    let hparams: Map<String, Value> = hparams(file)
        .into_iter()
        .map(|(k, v)| (k.to_string(), meta_json(v)))
        .collect();
    let mut tokenizer = Map::new();
    for (field, key) in [
        ("model", "tokenizer.ggml.model"),
        ("pre", "tokenizer.ggml.pre"),
    ] {
        tokenizer.insert(
            field.into(),
            json!(file.get(key).and_then(MetaValue::as_str)),
        );
    }
    tokenizer.insert("vocab_size".into(), json!(tokens(file).len()));
    for (label, key) in SPECIAL_TOKENS {
        let v = special_token(file, key).map(|(id, text)| json!({ "id": id, "text": text }));
        tokenizer.insert(label.into(), v.unwrap_or(Value::Null));
    }
    tokenizer.insert(
        "chat_template".into(),
        json!(file.get("tokenizer.chat_template").is_some()),
    );
    tokenizer.insert(
        "merges".into(),
        json!(array_len(file, "tokenizer.ggml.merges").unwrap_or(0)),
    );
    let metadata: Map<String, Value> = file
        .metadata()
        .iter()
        .map(|(k, v)| (k.clone(), meta_json(v)))
        .collect();
    let tensors: Vec<Value> = file
        .tensors()
        .iter()
        .map(|t| {
            json!({
                "name": t.name,
                "type": t.ggml_type.name(),
                "shape": t.dims,
                "offset": t.offset,
                "bytes": t.n_bytes,
            })
        })
        .collect();
    let totals = type_totals(file);
    let tensor_bytes: u64 = totals.values().map(|(_, b)| b).sum();
    let by_type: Map<String, Value> = totals
        .into_iter()
        .map(|(ty, (count, bytes))| (ty.name().into(), json!({ "count": count, "bytes": bytes })))
        .collect();
    json!({
        "file": path.display().to_string(),
        "version": file.version(),
        "file_size": file.file_size(),
        "alignment": file.alignment(),
        "data_offset": file.data_offset(),
        "architecture": file.architecture(),
        "hparams": hparams,
        "tokenizer": tokenizer,
        "metadata": metadata,
        "tensor_count": file.tensors().len(),
        "tensors": tensors,
        "type_totals": by_type,
        "tensor_bytes": tensor_bytes,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use minfer_gguf::{GgufWriter, MetaType};

    fn sample() -> GgufFile {
        let mut w = GgufWriter::new();
        let toks = ["<s>", "</s>", "a"]
            .map(|t| MetaValue::String(t.into()))
            .to_vec();
        w.add_meta("general.architecture", MetaValue::String("tiny".into()))
            .add_meta("tiny.block_count", MetaValue::U32(2))
            .add_meta("tiny.rope.freq_base", MetaValue::F32(1e4))
            .add_meta("tokenizer.ggml.model", MetaValue::String("gpt2".into()))
            .add_meta(
                "tokenizer.ggml.tokens",
                MetaValue::Array(MetaType::String, toks),
            )
            .add_meta("tokenizer.ggml.bos_token_id", MetaValue::U32(0))
            .add_meta("tokenizer.ggml.eos_token_id", MetaValue::U32(7))
            .add_meta(
                "long",
                MetaValue::Array(MetaType::U8, vec![MetaValue::U8(1); 17]),
            )
            .add_meta(
                "short",
                MetaValue::Array(MetaType::U8, vec![MetaValue::U8(1); 16]),
            );
        w.add_tensor_bytes("w", &[32, 2], GgmlType::Q8_0, vec![0; 68])
            .unwrap()
            .add_tensor_bytes("n", &[4], GgmlType::F32, vec![0; 16])
            .unwrap();
        GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap()
    }

    #[test]
    fn json_report_summarises_metadata_tokens_and_tensors() {
        let f = sample();
        let j = json_report(Path::new("m.gguf"), &f);
        assert_eq!(j["hparams"]["block_count"], 2);
        assert_eq!(j["hparams"]["rope.freq_base"], 10000.0);
        assert_eq!(meta_json(&MetaValue::F32(1e-6)), json!(1e-6));
        assert_eq!(meta_json(&MetaValue::F32(f32::NAN)), Value::Null);
        assert_eq!(j["tokenizer"]["vocab_size"], 3);
        assert_eq!(j["tokenizer"]["bos"], json!({ "id": 0, "text": "<s>" }));
        assert_eq!(j["tokenizer"]["eos"], json!({ "id": 7, "text": null }));
        assert_eq!(j["tokenizer"]["eot"], Value::Null);
        assert_eq!(j["tokenizer"]["chat_template"], false);
        assert_eq!(j["metadata"]["long"], json!({ "type": "u8", "len": 17 }));
        assert_eq!(j["metadata"]["short"].as_array().unwrap().len(), 16);
        assert_eq!(j["tensor_count"], 2);
        assert_eq!(j["tensors"][0]["shape"], json!([32, 2]));
        assert_eq!(j["type_totals"]["Q8_0"], json!({ "count": 1, "bytes": 68 }));
        assert_eq!(j["tensor_bytes"], 84);
    }

    #[test]
    fn text_report_lists_hparams_tokens_and_totals() {
        let f = sample();
        let s = text_report(Path::new("m.gguf"), &f);
        assert!(s.contains("architecture:  tiny"), "{s}");
        assert!(s.contains("  block_count     2\n"), "{s}");
        assert!(s.contains("bos            0 \"<s>\""), "{s}");
        assert!(s.contains("eos            7 (out of range)"), "{s}");
        assert!(s.contains("chat template  absent"), "{s}");
        assert!(
            s.contains("Q8_0        1 tensors            68 bytes"),
            "{s}"
        );
        assert!(
            s.contains("total       2 tensors            84 bytes"),
            "{s}"
        );
    }

    #[test]
    fn reports_name_the_i_quant_mxfp4_and_ternary_types() {
        let mut w = GgufWriter::new();
        w.add_meta("general.architecture", MetaValue::String("tiny".into()));
        for (i, ty) in [
            GgmlType::Iq2Xxs,
            GgmlType::Iq4Xs,
            GgmlType::Mxfp4,
            GgmlType::Tq1_0,
        ]
        .into_iter()
        .enumerate()
        {
            let bytes = ty.bytes_for(256).unwrap() as usize;
            w.add_tensor_bytes(&format!("t{i}"), &[256], ty, vec![0; bytes])
                .unwrap();
        }
        let f = GgufFile::from_bytes(w.to_bytes().unwrap()).unwrap();
        let s = text_report(Path::new("m.gguf"), &f);
        for name in ["IQ2_XXS", "IQ4_XS", "MXFP4", "TQ1_0"] {
            assert!(s.contains(name), "{name} missing from:\n{s}");
        }
        let j = json_report(Path::new("m.gguf"), &f);
        assert_eq!(
            j["type_totals"]["IQ4_XS"],
            json!({ "count": 1, "bytes": 136 })
        );
        assert_eq!(j["tensors"][2]["type"], "MXFP4");
    }

    #[test]
    fn device_limits_read_in_mib_with_the_exact_count_when_not_whole() {
        assert_eq!(mib(128 << 20), "128 MiB");
        assert_eq!(mib(u32::MAX as u64), "4096.0 MiB (4294967295 bytes)");
    }

    #[test]
    fn human_bytes_picks_a_unit() {
        assert_eq!(human_bytes(12), "12 B");
        assert_eq!(human_bytes(1536), "1.5 KiB");
        assert_eq!(human_bytes(491_400_064), "468.6 MiB");
    }
}
