//! `minfer quantize --imatrix`: the mix models quantized with importance matrices made by
//! llama.cpp's llama-imatrix (`tests/golden/imatrix/`) against llama-quantize's output with
//! the same matrices (`tests/golden/quant_imatrix.json`, from
//! `scripts/gen_quant_imatrix_golden.py`), and bad matrices refused by name.

use crate::common::assert_refused;
use crate::quantize::{assert_ok, minfer, sha256_hex, tiny};

use minfer_gguf::{GgufFile, MetaValue};
use minfer_models::testing::quant_mix_models;
use std::path::{Path, PathBuf};

fn golden_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden")
}

/// The `quantize.imatrix.*` keys of `f` but the file path (llama-quantize records the path
/// as given), as the golden file spells them.
fn imatrix_meta(f: &GgufFile) -> serde_json::Map<String, serde_json::Value> {
    f.metadata()
        .iter()
        .filter(|(k, _)| k.starts_with("quantize.imatrix.") && k != "quantize.imatrix.file")
        .map(|(k, v)| {
            let v = match v {
                MetaValue::String(s) => serde_json::json!(s),
                v => serde_json::json!(v.as_u64()),
            };
            (k.clone(), v)
        })
        .collect()
}

/// Every file type of the golden file, on the three mix models with their GGUF matrices
/// (and mix-qwen2's legacy .dat one): the lattice i-quants (IQ1_S, IQ1_M, IQ2_XXS,
/// IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S), IQ4_NL, IQ4_XS, Q2_K..Q6_K and Q4_0..Q5_1 take the
/// weights, Q8_0 ignores them, and the rule's imatrix branches pick the types; each tensor
/// must carry llama-quantize's type and bytes, and the file its `quantize.imatrix.*` keys.
#[test]
fn imatrix_mixes_match_llama_quantize() {
    let text = std::fs::read_to_string(golden_dir().join("quant_imatrix.json"))
        .expect("read quant_imatrix.json");
    let golden: serde_json::Value = serde_json::from_str(&text).expect("parse quant_imatrix.json");
    let dir = tempfile::tempdir().unwrap();
    let (mut wrong, mut checked) = (Vec::new(), 0);
    for (stem, spec) in quant_mix_models() {
        let entry = &golden["models"][stem];
        let src = tiny(dir.path(), &format!("{stem}.gguf"), &spec);
        let digest = sha256_hex(&std::fs::read(&src).unwrap());
        assert_eq!(
            entry["source_sha256"].as_str(),
            Some(digest.as_str()),
            "{stem}: the writer's file changed; regenerate the matrices and the golden file"
        );
        for (im, runs) in entry["imatrix"].as_object().expect("imatrix") {
            let im_path = golden_dir().join("imatrix").join(im);
            let im_sha = sha256_hex(&std::fs::read(&im_path).expect("read the matrix"));
            assert_eq!(
                runs["sha256"].as_str(),
                Some(im_sha.as_str()),
                "{im} changed"
            );
            for (ft, run) in runs["ftypes"].as_object().expect("ftypes") {
                let out = dir.path().join(format!("{stem}-{ft}.gguf"));
                let o = minfer(&[
                    "quantize",
                    "--imatrix",
                    im_path.to_str().unwrap(),
                    src.to_str().unwrap(),
                    out.to_str().unwrap(),
                    ft,
                ]);
                assert_ok(&o);
                let f = GgufFile::open(&out).expect("the output reads back");
                let tensors = run["tensors"].as_object().expect("tensors");
                assert_eq!(f.tensors().len(), tensors.len(), "{stem} {ft}");
                for t in f.tensors() {
                    let want = &tensors[&t.name];
                    let (ty, sha) = (want[0].as_str().unwrap_or(""), want[1].as_str());
                    if t.ggml_type.name() != ty {
                        wrong.push(format!(
                            "{stem} {im} {ft} {}: {} (llama-quantize {ty})",
                            t.name, t.ggml_type
                        ));
                    } else if Some(sha256_hex(f.tensor_data(t)).as_str()) != sha {
                        wrong.push(format!("{stem} {im} {ft} {} ({ty}): bytes differ", t.name));
                    }
                    checked += 1;
                }
                let meta = serde_json::Value::Object(imatrix_meta(&f));
                assert_eq!(
                    meta, run["meta"],
                    "{stem} {im} {ft}: quantize.imatrix.* keys"
                );
                std::fs::remove_file(&out).ok();
            }
        }
    }
    assert!(
        wrong.is_empty(),
        "{} of {checked} tensors differ:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

/// A truncated or foreign matrix, one whose sizes do not fit the model, and a low-bit mix
/// whose matrix lacks a tensor are refused naming the problem; without a matrix the
/// low-bit mix is written with a warning.
#[test]
fn bad_matrices_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let (stem, spec) = quant_mix_models().remove(1);
    let src = tiny(dir.path(), &format!("{stem}.gguf"), &spec);
    let (s, out) = (src.to_str().unwrap(), dir.path().join("out.gguf"));
    let out = out.to_str().unwrap();
    let good = golden_dir().join("imatrix/mix-qwen2.imatrix.dat");
    let bytes = std::fs::read(&good).unwrap();
    let cut = dir.path().join("cut.dat");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let o = minfer(&[
        "quantize",
        "--imatrix",
        cut.to_str().unwrap(),
        s,
        out,
        "Q4_K_M",
    ]);
    assert_refused(&o, "truncated");
    assert_refused(&o, "cut.dat");
    let text = dir.path().join("notes.txt");
    std::fs::write(&text, "not a matrix").unwrap();
    let o = minfer(&[
        "quantize",
        "--imatrix",
        text.to_str().unwrap(),
        s,
        out,
        "Q4_K_M",
    ]);
    assert_refused(&o, "neither GGUF nor");
    // Another model's matrix: mix-llama's rows are wider.
    let other = golden_dir().join("imatrix/mix-llama.imatrix.gguf");
    let o = minfer(&[
        "quantize",
        "--imatrix",
        other.to_str().unwrap(),
        s,
        out,
        "Q4_K_M",
    ]);
    assert_refused(&o, "values for blk.0.");
    let g = good.to_str().unwrap();
    // blk.1.ffn_down is IQ2_XXS in this mix (its rows of 256 fit the type).
    let o = minfer(&[
        "quantize",
        "--imatrix",
        g,
        "--exclude-weights",
        "blk.1.ffn_down",
        s,
        out,
        "IQ2_XXS",
    ]);
    assert_refused(&o, "no entry for blk.1.ffn_down.weight");
    assert!(!Path::new(out).exists(), "nothing written on refusal");
    let o = minfer(&["quantize", s, out, "IQ2_XXS"]);
    assert_ok(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning:") && err.contains("--imatrix"),
        "{err}"
    );
}
