//! A small Qwen2/Qwen3-style model run end to end (prefill, then decode steps) through
//! `GraphAllocator` + `BackendScheduler` on `CpuBackend`, against the reference backend.

mod common;

use common::*;
use minfer_gguf::GgmlType;

const PROMPT: [i32; 5] = [3, 141, 59, 26, 299];
const DECODE: [i32; 3] = [7, 0, 150];

fn all_f32(_: &str) -> GgmlType {
    GgmlType::F32
}

/// A mix of the types the default model uses, plus the other common ones.
fn mixed(name: &str) -> GgmlType {
    match name {
        n if n.contains("attn_q") => GgmlType::Q4K,
        n if n.contains("attn_k") => GgmlType::Q5_0,
        n if n.contains("attn_v") => GgmlType::Q6K,
        n if n.contains("attn_output") => GgmlType::Q8_0,
        n if n.contains("ffn_gate") => GgmlType::Q4_0,
        n if n.contains("ffn_up") => GgmlType::Q5K,
        n if n.contains("ffn_down") => GgmlType::Q6K,
        "token_embd.weight" => GgmlType::Q4K,
        "output.weight" => GgmlType::F16,
        _ => GgmlType::Q8_0,
    }
}

/// The i-quant and newer types with a CPU kernel, IQ4_XS/IQ4_NL where the downloads are.
fn iquants(name: &str) -> GgmlType {
    match name {
        n if n.contains("attn_q") => GgmlType::Iq4Xs,
        n if n.contains("attn_k") => GgmlType::Iq4Nl,
        n if n.contains("attn_v") => GgmlType::Mxfp4,
        n if n.contains("attn_output") => GgmlType::Iq4Nl,
        n if n.contains("ffn_gate") => GgmlType::Iq4Xs,
        n if n.contains("ffn_up") => GgmlType::Tq2_0,
        n if n.contains("ffn_down") => GgmlType::Iq4Xs,
        "token_embd.weight" => GgmlType::Iq4Xs,
        "output.weight" => GgmlType::Iq4Nl,
        _ => GgmlType::Tq1_0,
    }
}

fn compare(cfg: Cfg, ty: &dyn Fn(&str) -> GgmlType, gguf: bool, tol: f32) {
    let ws = make_weights(&cfg, 42, ty);
    let cpu = if gguf {
        cpu_gguf(&ws, 2)
    } else {
        cpu_f32(&ws, 2)
    };
    let (got, got_kv) = run_model(&mut Runner::cpu(cpu), &cfg, &ws, &PROMPT, &DECODE);
    let (want, want_kv) = run_model(&mut Runner::reference(&ws), &cfg, &ws, &PROMPT, &DECODE);
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g.len(), cfg.vocab);
        assert_close(g, w, tol, &format!("logits of step {step}"));
    }
    for (l, ((gk, gv), (wk, wv))) in got_kv.iter().zip(&want_kv).enumerate() {
        assert_close(gk, wk, tol, &format!("K of layer {l}"));
        assert_close(gv, wv, tol, &format!("V of layer {l}"));
        // Rows past the last position were never written.
        let used = (PROMPT.len() + DECODE.len()) * cfg.n_kv * cfg.hd;
        assert!(gk[used..].iter().all(|&v| v == 0.0));
    }
}

#[test]
fn qwen2_block_with_f32_weights_matches_the_reference() {
    // Only rounding differs (f64 norm sums, FMA dot products, incremental rope angles).
    compare(Cfg::small(false), &all_f32, false, 1e-5);
}

#[test]
fn qwen3_block_with_qk_norm_matches_the_reference() {
    compare(Cfg::small(true), &all_f32, false, 1e-5);
}

#[test]
fn quantized_gguf_weights_match_the_dequantized_reference() {
    // The CPU quantizes activations to Q8 for quantized matmuls; the reference multiplies the
    // decoded weights in f32. Measured: about 2.4% of the largest logit through two layers
    // of deliberately large random weights; the single-matmul bound is in tests/ops.rs.
    compare(Cfg::small(false), &mixed, true, 5e-2);
}

#[test]
fn iquant_gguf_weights_match_the_dequantized_reference() {
    // Weights written with the crate's IQ4_NL/IQ4_XS/MXFP4/ternary encoders; the bound is
    // that of the k-quant mix above (activation quantization dominates both). Measured:
    // 0.065 against a largest logit of 2.40 (2.7%) for the Qwen2 shape.
    compare(Cfg::small(false), &iquants, true, 5e-2);
    compare(Cfg::small(true), &iquants, true, 5e-2);
}

#[test]
fn f32_weights_from_gguf_and_owned_registration_agree_bitwise() {
    let cfg = Cfg::small(false);
    let ws = make_weights(&cfg, 7, &all_f32);
    let (a, ka) = run_model(
        &mut Runner::cpu(cpu_gguf(&ws, 2)),
        &cfg,
        &ws,
        &PROMPT,
        &DECODE,
    );
    let (b, kb) = run_model(
        &mut Runner::cpu(cpu_f32(&ws, 2)),
        &cfg,
        &ws,
        &PROMPT,
        &DECODE,
    );
    assert_eq!(a, b);
    assert_eq!(ka, kb);
}

#[test]
fn swiglu_fusion_is_bit_identical_to_silu_then_mul() {
    let cfg = Cfg::small(false);
    let ws = make_weights(&cfg, 9, &mixed);
    let mut fused = Runner::cpu(cpu_gguf(&ws, 2));
    let mut plain = Runner::cpu(cpu_gguf(&ws, 2));
    plain.fuse = false;
    let (a, ka) = run_model(&mut fused, &cfg, &ws, &PROMPT, &DECODE);
    let (b, kb) = run_model(&mut plain, &cfg, &ws, &PROMPT, &DECODE);
    assert_eq!(a, b);
    assert_eq!(ka, kb);
}

#[test]
fn prefill_in_one_pass_equals_token_by_token_decode() {
    // The last prompt token's logits must not depend on how the prompt was batched; only
    // activation-quantization grouping could differ, and it is per token.
    let cfg = Cfg::small(false);
    let ws = make_weights(&cfg, 11, &mixed);
    let mut batched = Runner::cpu(cpu_gguf(&ws, 2));
    let (a, ka) = run_model(&mut batched, &cfg, &ws, &PROMPT, &[]);
    let mut stepped = Runner::cpu(cpu_gguf(&ws, 2));
    let (b, kb) = run_model(&mut stepped, &cfg, &ws, &PROMPT[..1], &PROMPT[1..]);
    assert_close(&a[0], b.last().unwrap(), 1e-5, "last-token logits");
    assert_close(&ka[1].0, &kb[1].0, 1e-5, "layer 1 K");
}
