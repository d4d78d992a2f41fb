//! `minfer quantize` end to end: tiny F32 models written by the project's writer are
//! quantized, read back by the reader (each tensor's type by llama-quantize's rule) and
//! run; bad requests are refused by name.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Output;

use common::{assert_refused, minfer_command, test_home};
use minfer_gguf::{GgmlType, GgufFile};
use minfer_models::testing::{quant_mix_models, write_tiny_model, TinySpec};
use sha2::{Digest, Sha256};

pub(crate) fn minfer(args: &[&str]) -> Output {
    minfer_command(&test_home("quantize"))
        .args(args)
        .output()
        .expect("run minfer")
}

pub(crate) fn assert_ok(out: &Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

pub(crate) fn tiny(dir: &Path, name: &str, spec: &TinySpec) -> PathBuf {
    let p = dir.join(name);
    write_tiny_model(&p, spec).expect("write tiny model");
    p
}

/// Quantizes `src` to `ty` into `dir`, checks the progress lines, and returns the file.
fn quantize(dir: &Path, src: &Path, ty: &str, extra: &[&str]) -> GgufFile {
    let out = dir.join(format!("{ty}.gguf"));
    let mut args = vec!["quantize", src.to_str().unwrap(), out.to_str().unwrap(), ty];
    args.extend_from_slice(extra);
    let o = minfer(&args);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("wrote"),
        "{err}"
    );
    GgufFile::open(&out).expect("the output reads back")
}

/// The type of every tensor of `f` whose name ends with `suffix` (`output.weight` would
/// take `attn_output.weight` too: the tests read that one by its name).
fn types_of(f: &GgufFile, suffix: &str) -> Vec<GgmlType> {
    let v: Vec<_> = f
        .tensors()
        .iter()
        .filter(|t| t.name.ends_with(suffix))
        .map(|t| t.ggml_type)
        .collect();
    assert!(!v.is_empty(), "no tensor ends with {suffix}");
    v
}

fn assert_all(f: &GgufFile, suffix: &str, ty: GgmlType) {
    assert!(
        types_of(f, suffix).iter().all(|t| *t == ty),
        "{suffix}: {:?}, expected {ty}",
        types_of(f, suffix)
    );
}

/// A greedy run of the quantized model produces text.
fn assert_runs(dir: &Path, ty: &str) {
    let m = dir.join(format!("{ty}.gguf"));
    let o = minfer(&[
        "run",
        "-m",
        m.to_str().unwrap(),
        "--temp",
        "0",
        "-n",
        "6",
        "-t",
        "2",
        "Hello",
    ]);
    assert_ok(&o);
    assert!(!o.stdout.is_empty(), "{ty}: no text");
}

fn file_type(f: &GgufFile) -> u64 {
    f.get("general.file_type")
        .and_then(|v| v.as_u64())
        .expect("general.file_type")
}

/// Width 128 (rows of 128 and, for ffn_down, 256) with an output matrix: the 32-block
/// types take every matrix, the output Q8_0 (its rows do not fill Q6_K's 256), norms F32;
/// Q4_K_S falls back to Q5_0 on the 128-rows.
#[test]
fn tiny_qwen2_to_q8_0_iq4_nl_and_q4_k() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny(dir.path(), "f32.gguf", &TinySpec::qwen2(GgmlType::F32, 7));
    for (name, ty, ft) in [("Q8_0", GgmlType::Q8_0, 7), ("IQ4_NL", GgmlType::Iq4Nl, 25)] {
        let f = quantize(dir.path(), &src, name, &[]);
        for m in [
            "attn_q.weight",
            "attn_k.weight",
            "attn_v.weight",
            "ffn_up.weight",
        ] {
            assert_all(&f, m, ty);
        }
        assert_all(&f, "token_embd.weight", ty);
        assert_eq!(f.tensor("output.weight").unwrap().ggml_type, GgmlType::Q8_0);
        assert_all(&f, "_norm.weight", GgmlType::F32);
        assert_all(&f, ".bias", GgmlType::F32);
        assert_eq!(file_type(&f), ft);
        assert_runs(dir.path(), name);
    }
    let f = quantize(dir.path(), &src, "Q4_K_S", &[]);
    assert_all(&f, "attn_q.weight", GgmlType::Q5_0);
    assert_all(&f, "ffn_down.weight", GgmlType::Q4K);
    assert_eq!(f.tensor("output.weight").unwrap().ggml_type, GgmlType::Q8_0);
    assert_eq!(file_type(&f), 14);
    assert_runs(dir.path(), "Q4_K_S");
}

/// Rows of 256 and a tied head: every matrix but the value projections takes the 256-block
/// type (those Q5_K: the mixes raise them at 4 query heads per KV head), and the embedding
/// (the output here) Q6_K; a quantized file is requantized only when asked.
#[test]
fn tiny_llama3_to_q4_k_and_iq4_xs_and_requantize() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::llama3_kquant(GgmlType::F32, 57);
    let src = tiny(dir.path(), "f32.gguf", &spec);
    for (name, ty, ft) in [
        ("Q4_K_S", GgmlType::Q4K, 14),
        ("IQ4_XS", GgmlType::Iq4Xs, 30),
    ] {
        let f = quantize(dir.path(), &src, name, &[]);
        for m in [
            "attn_q.weight",
            "attn_output.weight",
            "ffn_gate.weight",
            "ffn_down.weight",
        ] {
            assert_all(&f, m, ty);
        }
        assert_all(&f, "attn_v.weight", GgmlType::Q5K);
        assert!(f.tensor("output.weight").is_none());
        assert_all(&f, "token_embd.weight", GgmlType::Q6K);
        assert_all(&f, "_norm.weight", GgmlType::F32);
        assert_all(&f, "rope_freqs.weight", GgmlType::F32);
        assert_eq!(file_type(&f), ft);
        assert_runs(dir.path(), name);
    }
    // The IQ4_XS file is quantized: refused without the flag, decoded and re-encoded with.
    let q = dir.path().join("IQ4_XS.gguf");
    let out = dir.path().join("again.gguf");
    let o = minfer(&[
        "quantize",
        q.to_str().unwrap(),
        out.to_str().unwrap(),
        "Q8_0",
    ]);
    assert_refused(&o, "--allow-requantize");
    assert_refused(&o, "already quantized");
    let f = quantize(dir.path(), &q, "Q8_0", &["--allow-requantize"]);
    assert_all(&f, "attn_q.weight", GgmlType::Q8_0);
    assert_all(&f, "token_embd.weight", GgmlType::Q8_0);
    assert_runs(dir.path(), "Q8_0");
}

/// The lattice i-quants: IQ3_S with a Q6_K head; IQ2_XXS with llama-quantize's Q5_K head
/// for its mix; both with Q4_K value projections (4 query heads per KV head). Both run.
#[test]
fn tiny_llama3_to_lattice_i_quants() {
    let dir = tempfile::tempdir().unwrap();
    let spec = TinySpec::llama3_kquant(GgmlType::F32, 57);
    let src = tiny(dir.path(), "f32.gguf", &spec);
    for (name, ty, head, ft) in [
        ("IQ3_S", GgmlType::Iq3S, GgmlType::Q6K, 26),
        ("IQ2_XXS", GgmlType::Iq2Xxs, GgmlType::Q5K, 19),
    ] {
        let f = quantize(dir.path(), &src, name, &[]);
        for m in ["attn_q.weight", "ffn_down.weight"] {
            assert_all(&f, m, ty);
        }
        assert_all(&f, "attn_v.weight", GgmlType::Q4K);
        // The tied embedding is the head.
        assert_all(&f, "token_embd.weight", head);
        assert_all(&f, "_norm.weight", GgmlType::F32);
        assert_eq!(file_type(&f), ft);
        assert_runs(dir.path(), name);
    }
}

#[test]
fn bad_requests_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let src = tiny(dir.path(), "f32.gguf", &TinySpec::qwen2(GgmlType::F32, 7));
    let (s, out) = (src.to_str().unwrap(), dir.path().join("out.gguf"));
    let out = out.to_str().unwrap();
    let o = minfer(&["quantize", s, out, "Q4_K_X"]);
    assert_refused(&o, "unknown type `Q4_K_X`");
    assert_refused(&o, "IQ4_XS");
    let o = minfer(&["quantize", s, s, "Q8_0"]);
    assert_refused(&o, "OUT is IN");
    let o = minfer(&["quantize", "missing.gguf", out, "Q8_0"]);
    assert_refused(&o, "missing.gguf");
    assert!(!Path::new(out).exists(), "nothing written on refusal");
}

pub(crate) fn sha256_hex(b: &[u8]) -> String {
    Sha256::digest(b)
        .iter()
        .map(|x| format!("{x:02x}"))
        .collect()
}

/// Every file type llama-quantize writes without an importance matrix, on the mix models
/// (8 layers; grouped, plain and expert attention; whole and partial k-quant rows): each
/// tensor gets llama-quantize's type and llama-quantize's bytes
/// (`tests/golden/quant_mix.json`, from `scripts/gen_quant_mix_golden.py`).
#[test]
fn mixes_match_llama_quantize() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden/quant_mix.json");
    let text = std::fs::read_to_string(&path).expect("read quant_mix.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("parse quant_mix.json");
    let dir = tempfile::tempdir().unwrap();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for (stem, spec) in quant_mix_models() {
        let entry = &golden["models"][stem];
        let src = tiny(dir.path(), &format!("{stem}.gguf"), &spec);
        let digest = sha256_hex(&std::fs::read(&src).unwrap());
        assert_eq!(
            entry["source_sha256"].as_str(),
            Some(digest.as_str()),
            "{stem}: the writer's file changed; regenerate the golden file"
        );
        let ftypes = entry["ftypes"].as_object().expect("ftypes");
        for (ft, tensors) in ftypes {
            let out = dir.path().join(format!("{stem}-{ft}.gguf"));
            let o = minfer(&["quantize", src.to_str().unwrap(), out.to_str().unwrap(), ft]);
            assert_ok(&o);
            let f = GgufFile::open(&out).expect("the output reads back");
            let tensors = tensors.as_object().expect("tensors");
            assert_eq!(f.tensors().len(), tensors.len(), "{stem} {ft}");
            for t in f.tensors() {
                let want = &tensors[&t.name];
                let (ty, sha) = (
                    want[0].as_str().unwrap_or(""),
                    want[1].as_str().unwrap_or(""),
                );
                if t.ggml_type.name() != ty {
                    wrong.push(format!(
                        "{stem} {ft} {}: {} (llama-quantize {ty})",
                        t.name, t.ggml_type
                    ));
                } else if sha256_hex(f.tensor_data(t)) != sha {
                    wrong.push(format!("{stem} {ft} {} ({ty}): bytes differ", t.name));
                }
                checked += 1;
            }
            std::fs::remove_file(&out).ok();
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked} tensors differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}
