//! Writes the golden set of tiny random-weight models into a directory, with a
//! `manifest.json` describing each (stem, file, spec), for the reference script, and the
//! F32 models of the quantization-mix check into `DIR/mix` with a manifest of their own,
//! and the tiny BERT encoders and the tiny BERT reranker (no logits: the embedding
//! reference reads them) into `DIR/bert`:
//!
//! ```text
//! cargo run -p minfer-models --example write_tiny_models -- DIR
//! python3 scripts/gen_tiny_reference.py DIR
//! python3 scripts/gen_quant_mix_golden.py DIR/mix
//! ```

use std::path::PathBuf;
use std::process::ExitCode;

use minfer_models::testing::{
    bert_models, bert_reranker, golden_models, nomic_models, quant_mix_models, write_tiny_bert,
    write_tiny_model, TinySpec,
};

/// The spec as JSON; `sliding_window` and the expert geometry only where set, so the
/// other entries read as before.
fn spec_json(s: &TinySpec) -> String {
    let window = s
        .sliding_window
        .map_or(String::new(), |w| format!(",\"sliding_window\":{w}"));
    let moe = s.moe.as_ref().map_or(String::new(), |m| {
        format!(
            ",\"n_expert\":{},\"n_expert_used\":{},\"n_ff_exp\":{},\"n_ff_shexp\":{}",
            m.n_expert, m.n_expert_used, m.n_ff_exp, m.n_ff_shexp
        )
    });
    let ssm = s.ssm.as_ref().map_or(String::new(), |m| {
        format!(
            ",\"ssm_d_conv\":{},\"ssm_state\":{},\"ssm_h_k\":{},\"ssm_h_v\":{},\
             \"full_attention_interval\":{},\"n_rot\":{}",
            m.d_conv, m.s, m.h_k, m.h_v, m.interval, m.n_rot
        )
    });
    format!(
        "{{\"arch\":\"{}\",\"n_layer\":{},\"n_embd\":{},\"n_head\":{},\"n_head_kv\":{},\
         \"head_dim\":{},\"n_ff\":{},\"n_vocab\":{},\"n_ctx\":{},\"wtype\":\"{}\",\
         \"tied\":{},\"rope_freqs\":{}{window}{moe}{ssm},\"seed\":{}}}",
        s.arch,
        s.n_layer,
        s.n_embd,
        s.n_head,
        s.n_head_kv,
        s.head_dim,
        s.n_ff,
        s.n_vocab,
        s.n_ctx,
        s.wtype,
        s.tied,
        s.rope_freqs,
        s.seed
    )
}

fn main() -> ExitCode {
    let Some(dir) = std::env::args_os().nth(1).map(PathBuf::from) else {
        eprintln!("usage: write_tiny_models DIR");
        return ExitCode::from(2);
    };
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let mix = dir.join("mix");
    if let Err(e) = write_set(&dir, golden_models())
        .and_then(|()| write_set(&mix, quant_mix_models()))
        .and_then(|()| write_berts(&dir.join("bert")))
    {
        eprintln!("{e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}

/// Writes `models` into `dir` with their `manifest.json`.
fn write_set(dir: &std::path::Path, models: Vec<(&'static str, TinySpec)>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let mut entries = Vec::new();
    for (stem, spec) in models {
        let file = format!("{stem}.gguf");
        let path = dir.join(&file);
        write_tiny_model(&path, &spec).map_err(|e| format!("{stem}: {e}"))?;
        let size = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        println!("{file}: {size} bytes");
        entries.push(format!(
            "{{\"name\":\"{stem}\",\"file\":\"{file}\",\"spec\":{}}}",
            spec_json(&spec)
        ));
    }
    let manifest = format!("[{}]\n", entries.join(","));
    std::fs::write(dir.join("manifest.json"), manifest)
        .map_err(|e| format!("cannot write the manifest: {e}"))
}

/// Writes the tiny BERTs, the reranker and the tiny nomic-berts into `dir` (their stems name them; no manifest is needed).
fn write_berts(dir: &std::path::Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    for (stem, spec) in bert_models()
        .into_iter()
        .chain([bert_reranker()])
        .chain(nomic_models())
    {
        let path = dir.join(format!("{stem}.gguf"));
        write_tiny_bert(&path, &spec).map_err(|e| format!("{stem}: {e}"))?;
        println!(
            "bert/{stem}.gguf: {} bytes",
            std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0)
        );
    }
    Ok(())
}
