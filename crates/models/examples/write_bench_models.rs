//! Writes random-weight models at realistic shapes, for paired speed runs against
//! llama.cpp and ik_llama.cpp on the same file (the weights are noise, so the files are
//! for timing only; their numerics are checked by the tiny golden models):
//!
//! ```text
//! cargo run --release -p minfer-models --example write_bench_models -- DIR [NAME ...]
//! ```
//!
//! NAME is one of the models below (all of them without a NAME). A model written in F16
//! is meant to be requantized with `minfer quantize` to a llama-quantize mix, so that
//! widths that are not whole k-quant blocks get the mix's fallback types, as in the
//! published files.

use std::path::PathBuf;
use std::process::ExitCode;

use minfer_gguf::GgmlType;
use minfer_models::testing::{write_tiny_model, TinyMoe, TinySpec, TinySsm};

/// The models: a name, what it stands for, and its spec.
fn models() -> Vec<(&'static str, &'static str, TinySpec)> {
    vec![
        (
            "qwen35-0.8b-q4_k",
            "Qwen3.5-0.8B's shapes (24 layers, every fourth full attention; width 1024, 8 \
             query heads of 256 over 2 KV heads, 64 rotated dims; 16 key and 16 value \
             DeltaNet heads of 128, a 4-wide convolution; FFN 3584; vocabulary 248320, tied \
             head), Q4_K",
            TinySpec {
                arch: "qwen35",
                n_layer: 24,
                n_embd: 1024,
                n_head: 8,
                n_head_kv: 2,
                head_dim: 256,
                n_ff: 3584,
                n_vocab: 248320,
                n_ctx: 8192,
                wtype: GgmlType::Q4K,
                tied: true,
                rope_freqs: false,
                sliding_window: None,
                moe: None,
                ssm: Some(TinySsm {
                    d_conv: 4,
                    s: 128,
                    h_k: 16,
                    h_v: 16,
                    interval: 4,
                    n_rot: 64,
                    sections: [11, 11, 10, 0],
                }),
                seed: 1,
            },
        ),
        (
            "gemma3-1b-f16",
            "Gemma 3 1B's shapes (26 layers, every sixth global, the others a 512-row \
             sliding window; width 1152, 4 query heads of 256 over 1 KV head; FFN 6912; \
             vocabulary 262144, tied head), F16",
            TinySpec {
                arch: "gemma3",
                n_layer: 26,
                n_embd: 1152,
                n_head: 4,
                n_head_kv: 1,
                head_dim: 256,
                n_ff: 6912,
                n_vocab: 262144,
                n_ctx: 32768,
                wtype: GgmlType::F16,
                tied: true,
                rope_freqs: false,
                sliding_window: Some(512),
                moe: None,
                ssm: None,
                seed: 1,
            },
        ),
        (
            "qwen3moe-a3b-4l-q4_k",
            "Qwen3-30B-A3B's shapes (width 2048, 32 query heads of 128 over 4 KV heads, 128 \
         experts of width 768, 8 used, vocabulary 151936) with 4 of its 48 layers, Q4_K",
            TinySpec {
                arch: "qwen3moe",
                n_layer: 4,
                n_embd: 2048,
                n_head: 32,
                n_head_kv: 4,
                head_dim: 128,
                n_ff: 6144,
                n_vocab: 151936,
                n_ctx: 8192,
                wtype: GgmlType::Q4K,
                tied: false,
                rope_freqs: false,
                sliding_window: None,
                moe: Some(TinyMoe {
                    n_expert: 128,
                    n_expert_used: 8,
                    n_ff_exp: 768,
                    n_ff_shexp: 0,
                }),
                ssm: None,
                seed: 1,
            },
        ),
    ]
}

fn main() -> ExitCode {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next().map(PathBuf::from) else {
        eprintln!("usage: write_bench_models DIR [NAME ...]");
        return ExitCode::from(2);
    };
    let names: Vec<String> = args.collect();
    if let Err(e) = std::fs::create_dir_all(&dir) {
        eprintln!("cannot create {}: {e}", dir.display());
        return ExitCode::FAILURE;
    }
    let all = models();
    for n in &names {
        if !all.iter().any(|(m, _, _)| m == n) {
            let known: Vec<&str> = all.iter().map(|(m, _, _)| *m).collect();
            eprintln!("unknown model `{n}`; known: {}", known.join(", "));
            return ExitCode::from(2);
        }
    }
    for (name, what, spec) in all {
        if !names.is_empty() && !names.iter().any(|n| n == name) {
            continue;
        }
        let path = dir.join(format!("{name}.gguf"));
        eprintln!("writing {} ({what})", path.display());
        if let Err(e) = write_tiny_model(&path, &spec) {
            eprintln!("{name}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}
